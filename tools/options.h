// The tools' command-line options, each declared once: its names, the variable it fills, its range or
// choices, its help text and its heading. CLI11 reads the command line; --help is generated from the
// declarations (the default of each value option appended from the variable's value at declaration); a tool
// that takes run files also reads `--config RUN.toml` (tools/run_file.h: the keys are the long names without
// their dashes, the command line overrides the file) and writes the effective configuration with
// --print-config. Every bad value throws rp::Error in the tools' wording ("--lora-rank: '0' is not an integer
// in [1, 1048576]"; in a run file prefixed "RUN.toml:LINE: KEY = VALUE: "), which the tools print as
// "error: ..." before exiting 1.
#pragma once

#include "tools/cli.h"
#include "tools/run_file.h"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace rp::cli {

class Options {
public:
    // `usage`: the first lines of --help ("usage: rp-finetune -m BASE.gguf ... [options]").
    Options(std::string tool, std::string usage);
    ~Options();
    Options(const Options &) = delete;
    Options & operator=(const Options &) = delete;

    // Help layout: the options declared after group() are listed under `heading`; a note is a paragraph
    // printed where it is declared.
    Options & group(const std::string & heading);
    Options & note(const std::string & text);

    // `names`: comma-separated, e.g. "-m,--model" or "--data,--file" (the first long name is the run-file key
    // and the one the help lists first; the others are aliases, llama.cpp's names where they differ).
    Options & flag(const std::string & names, bool & target, const std::string & help);
    // A pair of flags for one boolean: "--async" sets it, "--sync" clears it (run-file key: the first).
    Options & toggle(const std::string & on, const std::string & off, bool & target, const std::string & help);
    template <class T>
    Options & integer(const std::string & names, T & target, long long lo, long long hi, const std::string & help,
                      const std::string & value_name = "N") {
        return value(names, value_name, help, Int,
                     [&target, lo, hi](const std::string & flag, const std::string & v) { target = static_cast<T>(parse_int(flag, v, lo, hi)); },
                     [&target] { return std::optional<std::string>(std::to_string(target)); });
    }
    // An integer whose 0 means "not given" (the run file then leaves it out): --steps, --stop-at, ...
    template <class T>
    Options & optional_integer(const std::string & names, T & target, long long lo, long long hi, const std::string & help,
                               const std::string & value_name = "N") {
        return value(names, value_name, help, Int,
                     [&target, lo, hi](const std::string & flag, const std::string & v) { target = static_cast<T>(parse_int(flag, v, lo, hi)); },
                     [&target] { return target ? std::optional<std::string>(std::to_string(target)) : std::nullopt; });
    }
    Options & number(const std::string & names, float & target, const std::string & help, const std::string & value_name = "X");
    Options & number(const std::string & names, float & target, float lo, float hi, const std::string & help,
                     const std::string & value_name = "X");
    Options & number(const std::string & names, double & target, double lo, double hi, const std::string & help,
                     const std::string & value_name = "X");
    Options & text(const std::string & names, std::string & target, const std::string & help, const std::string & value_name = "FILE");
    // A text that may be given empty (-p ""): nullopt until given.
    Options & text(const std::string & names, std::optional<std::string> & target, const std::string & help,
                   const std::string & value_name = "TEXT");
    // A byte count (parse_size: 4096, 64M, 1.5G); zero_ok: "0" is a value too.
    Options & size(const std::string & names, size_t & target, const std::string & help, bool zero_ok = false,
                   const std::string & value_name = "SIZE");
    // Byte counts, one for every item or one per item ("64M", "24G,16G"): one value sets `each` and clears `list`,
    // several set `list` (in a run file: an integer, or the same text).
    Options & sizes(const std::string & names, size_t & each, std::vector<size_t> & list, const std::string & help,
                    const std::string & value_name = "SIZE[,...]");
    Options & choice(const std::string & names, std::string & target, const std::vector<std::string> & allowed, const std::string & help,
                     const std::string & value_name = "NAME");
    // Comma-separated on the command line ("a,b,c"), an array of strings in a run file.
    Options & list(const std::string & names, std::vector<std::string> & target, const std::string & help, const std::string & value_name = "L");

    // "-t, --threads N": CPU threads in [lo, 4096], 0 = all cores when lo is 0; the help says how they wait.
    Options & threads(int & target, int lo = 0, const std::string & help = "CPU threads (default 0: all)");
    // A pair of flags for a choice that may stay unmade (nullopt: neither given): "--show-thinking" sets
    // true, "--hide-thinking" false.
    Options & toggle(const std::string & on, const std::string & off, std::optional<bool> & target, const std::string & help);

    // The general form. `set(flag, text)` parses one value (throwing rp::Error that names `flag`); `show()` is
    // the current value as a TOML literal (nullopt: not set). `types`: the TOML types a run file may give,
    // a bitmask of Bool | Int | Float | String | Array (an array: set() once per element, in order).
    enum TypeMask : unsigned { Bool = 1, Int = 2, Float = 4, String = 8, Array = 16 };
    using Setter = std::function<void(const std::string & flag, const std::string & text)>;
    using Shower = std::function<std::optional<std::string>()>;
    Options & value(const std::string & names, const std::string & value_name, const std::string & help, unsigned types, Setter set,
                    Shower show);
    // A flag whose effect is an action (no run-file key): --help-like switches.
    Options & action(const std::string & names, const std::string & help, std::function<void()> on);
    // Repeatable: every occurrence calls set() (the first one of a new source — a run file, the command line
    // — calls reset() before it, so that the command line replaces a file's list instead of extending it).
    Options & repeated(const std::string & names, const std::string & value_name, const std::string & help, Setter set,
                       std::function<void()> reset, Shower show);
    // The arguments that are not options ("rp-trace A.json B.json"), in order: at least `min`, at most `max`
    // (-1: any number); listed in --help under `name`. Without it, an argument that is not an option is an error.
    Options & positionals(const std::string & name, std::vector<std::string> & target, int min, int max, const std::string & help);

    // The option declared last is for this invocation only (--plan, --resume): not a run-file key.
    Options & local();

    // The option declared last is in run files but not carried from a checkpoint's recorded configuration to
    // its resume (a stop point, fault injection, a trace: what one invocation asks for).
    Options & not_resumed();
    // Reads a checkpoint's recorded configuration: a run file without the not_resumed() options.
    void read_recorded_text(const std::string & text, const std::string & origin);

    // Adds --config FILE and --print-config (the tool prints run_file() and exits when print_config()).
    Options & run_files();
    // Reads a run file's text into the options (before parse(): the command line overrides it).
    void read_run_text(const std::string & text, const std::string & origin);
    void read_run_file(const std::string & path);

    // Reads the command line (and first the --config file). Returns false when --help was given (printed).
    bool parse(int argc, char ** argv);
    bool print_config() const { return print_config_; }
    // The value of `flag` on a command line before parsing it (the last one), e.g. --resume; nullopt if absent.
    static std::optional<std::string> find(int argc, char ** argv, const std::string & flag);

    std::string help() const;
    // The effective configuration as a run file: every option with a run-file key, under its heading; unset
    // ones as comments.
    std::string run_file() const;
    // key -> TOML literal of every run-file option that is set (resumed_only: but the not_resumed() ones).
    std::map<std::string, std::string> values(bool resumed_only = false) const;
    // Every long name and alias ("--lora-rank"), in declaration order.
    std::vector<std::string> long_names() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    bool print_config_ = false;
};

} // namespace rp::cli
