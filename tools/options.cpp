#include "tools/options.h"

#include "base/error.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace rp::cli {

namespace {

enum class Kind { Flag, Toggle, Value, Repeated, Action };

struct Opt {
    Kind kind = Kind::Value;
    std::vector<std::string> shorts, longs;  // with their dashes; longs[0] names the option
    std::string off;                         // Toggle: the flag that clears it
    std::string value_name, help, group;
    unsigned types = 0;
    Options::Setter set;
    Options::Shower show;
    std::function<void()> reset;             // Repeated
    std::function<void(bool)> set_flag;      // Flag, Toggle
    std::function<void()> on;                // Action
    bool local = false;
    bool resumed = true;                     // carried from a checkpoint's recorded configuration
    bool bytes = false;                      // a size: the help shows its default as 24G, 64M, ...
    int source = -1;                         // Repeated: the source that set it last
    std::string key() const { return longs[0].substr(2); }
};

std::vector<std::string> split_names(const std::string & names) {
    std::vector<std::string> out;
    for (const std::string & n : split_commas(names)) out.push_back(n);
    return out;
}

// A TOML literal as a reader would see it in the help: strings without their quotes, arrays comma-joined.
std::string plain(const std::string & literal) {
    if (literal.size() >= 2 && literal.front() == '"') {
        const auto items = parse_run_file("v = " + literal + "\n", "default");
        return items.at(0).value.text;
    }
    if (literal.size() >= 2 && literal.front() == '[') {
        const auto items = parse_run_file("v = " + literal + "\n", "default");
        std::string out;
        for (const TomlValue & v : items.at(0).value.items) out += (out.empty() ? "" : ",") + v.text;
        return out;
    }
    if (literal.find_first_of(".e") != std::string::npos && literal.find_first_not_of("0123456789.e+-") == std::string::npos) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%g", std::strtod(literal.c_str(), nullptr));
        return buf;
    }
    return literal;
}

// A byte count the way a user writes it: 25769803776 -> "24G".
std::string size_text(const std::string & literal) {
    const unsigned long long v = std::strtoull(literal.c_str(), nullptr, 10);
    static const char * const units[] = {"T", "G", "M", "K"};
    for (int i = 0; i < 4; ++i) {
        const unsigned long long unit = 1ull << (10 * (4 - i));
        if (v && v % unit == 0) return std::to_string(v / unit) + units[i];
    }
    return literal;
}

std::string literal_of(const TomlValue & v) {
    if (v.type == TomlType::String) return toml_string(v.text);
    if (v.type != TomlType::Array) return v.text;
    std::string out = "[";
    for (const TomlValue & i : v.items) out += (out.size() > 1 ? ", " : "") + literal_of(i);
    return out + "]";
}

} // namespace

struct Options::Impl {
    std::string tool, usage;
    CLI::App app;
    std::vector<Opt> opts;
    struct Line {
        std::string group;
        bool note = false;
        std::string text;   // a note
        size_t opt = 0;
    };
    std::vector<Line> layout;
    std::string group;
    int source = 0;
    bool run_files = false;
    struct Positionals {
        std::string name, help;
        std::vector<std::string> * target = nullptr;
        int min = 0, max = 0;
    } positionals;

    Impl(std::string t, std::string u) : tool(std::move(t)), usage(std::move(u)), app(tool, tool) {
        app.set_help_flag();
        app.allow_extras(true);
    }

    Opt & add(Opt o, const std::string & names) {
        for (const std::string & n : split_names(names)) {
            if (n.size() == 2 && n[0] == '-' && n[1] != '-') o.shorts.push_back(n);
            else if (n.size() > 2 && n.compare(0, 2, "--") == 0) o.longs.push_back(n);
            else throw std::logic_error("option name '" + n + "' is neither -x nor --name");
        }
        if (o.longs.empty()) throw std::logic_error("option " + names + " has no long name");
        o.group = group;
        opts.push_back(std::move(o));
        layout.push_back({group, false, "", opts.size() - 1});
        return opts.back();
    }

    void add_toggle(const std::string & on, const std::string & off, const std::string & help, std::function<void(bool)> set_flag,
                    Options::Shower show) {
        Opt o;
        o.kind = Kind::Toggle;
        o.help = help;
        o.types = Options::Bool;
        o.off = off;
        o.set_flag = std::move(set_flag);
        o.show = std::move(show);
        add(std::move(o), on);
        const size_t i = opts.size() - 1;
        app.add_flag_callback(on, [this, i] { opts[i].set_flag(true); })->trigger_on_parse();
        app.add_flag_callback(off, [this, i] { opts[i].set_flag(false); })->trigger_on_parse();
    }

    Opt * by_key(const std::string & key) {
        for (Opt & o : opts)
            for (const std::string & l : o.longs)
                if (l.substr(2) == key) return &o;
        return nullptr;
    }

    // Applies one value of option o from source `src`; `flag` names it in errors.
    void apply(Opt & o, const std::string & flag, const std::string & text) {
        if (o.kind == Kind::Repeated && o.source != source) {
            o.source = source;
            o.reset();
        }
        o.set(flag, text);
    }

    void apply_entry(const RunFileEntry & e, const std::string & origin) {
        const std::string where = origin + ":" + std::to_string(e.line) + ": ";
        Opt * o = by_key(e.key);
        if (!o || o->kind == Kind::Action)
            throw rp::Error(where + "unknown key '" + e.key + "' (the keys are " + tool + "'s long option names without the dashes; see " +
                            tool + " --help)");
        if (o->local) throw rp::Error(where + "'" + e.key + "' is not a run-file key: give --" + e.key + " on the command line");
        const unsigned bit = 1u << static_cast<unsigned>(e.value.type);
        if (!(o->types & bit) || (e.value.type == TomlType::Array && !std::all_of(e.value.items.begin(), e.value.items.end(), [&](const TomlValue & i) {
                                      return (o->types & (1u << static_cast<unsigned>(i.type))) != 0;
                                  }))) {
            std::string want;
            for (unsigned t = 0; t < 5; ++t)
                if (o->types & (1u << t)) want += (want.empty() ? "" : " or ") + std::string(toml_type_name(static_cast<TomlType>(t)));
            throw rp::Error(where + e.key + ": expected " + want + ", got " + toml_type_name(e.value.type) +
                            (e.value.type == TomlType::Array ? " (or an array holding something else)" : ""));
        }
        try {
            if (o->kind == Kind::Flag || o->kind == Kind::Toggle) o->set_flag(e.value.text == "true");
            else if (e.value.type != TomlType::Array) apply(*o, o->longs[0], e.value.text);
            else if (o->kind == Kind::Repeated) {
                o->source = source;
                o->reset();
                for (const TomlValue & i : e.value.items) o->set(o->longs[0], i.text);
            } else {
                std::string joined;
                for (const TomlValue & i : e.value.items) joined += (joined.empty() ? "" : ",") + i.text;
                apply(*o, o->longs[0], joined);
            }
        } catch (const rp::Error & err) {
            throw rp::Error(where + e.key + " = " + literal_of(e.value) + ": " + err.what());
        }
    }
};

Options::Options(std::string tool, std::string usage) : impl_(std::make_unique<Impl>(std::move(tool), std::move(usage))) {
    action("-h,--help", "this text", [] {});
    local();
}

Options::~Options() = default;

Options & Options::group(const std::string & heading) {
    impl_->group = heading;
    return *this;
}

Options & Options::note(const std::string & text) {
    impl_->layout.push_back({impl_->group, true, text, 0});
    return *this;
}

Options & Options::flag(const std::string & names, bool & target, const std::string & help) {
    Opt o;
    o.kind = Kind::Flag;
    o.help = help;
    o.types = Bool;
    o.set_flag = [&target](bool v) { target = v; };
    o.show = [&target] { return std::optional<std::string>(target ? "true" : "false"); };
    Opt & d = impl_->add(std::move(o), names);
    Impl * impl = impl_.get();
    const size_t i = impl->opts.size() - 1;
    impl->app.add_flag_callback(names, [impl, i] { impl->opts[i].set_flag(true); })->trigger_on_parse();
    (void)d;
    return *this;
}

Options & Options::toggle(const std::string & on, const std::string & off, bool & target, const std::string & help) {
    impl_->add_toggle(on, off, help, [&target](bool v) { target = v; },
                      [&target] { return std::optional<std::string>(target ? "true" : "false"); });
    return *this;
}

Options & Options::toggle(const std::string & on, const std::string & off, std::optional<bool> & target, const std::string & help) {
    impl_->add_toggle(on, off, help, [&target](bool v) { target = v; },
                      [&target] { return target ? std::optional<std::string>(*target ? "true" : "false") : std::nullopt; });
    return *this;
}

Options & Options::threads(int & target, int lo, const std::string & help) {
    return integer("-t,--threads", target, lo, 4096, help + "\n" + threads_wait_help());
}

Options & Options::value(const std::string & names, const std::string & value_name, const std::string & help, unsigned types, Setter set,
                         Shower show) {
    Opt o;
    o.kind = Kind::Value;
    o.value_name = value_name;
    o.help = help;
    o.types = types;
    o.set = std::move(set);
    o.show = std::move(show);
    impl_->add(std::move(o), names);
    Impl * impl = impl_.get();
    const size_t i = impl->opts.size() - 1;
    // One CLI11 option per name, so that an error names the flag as it was typed ("-c: ..." or "--seq-len: ...").
    for (const std::string & n : split_names(names))
        impl->app.add_option_function<std::string>(n, [impl, i, n](const std::string & v) { impl->apply(impl->opts[i], n, v); })
            ->trigger_on_parse()
            ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    return *this;
}

Options & Options::repeated(const std::string & names, const std::string & value_name, const std::string & help, Setter set,
                            std::function<void()> reset, Shower show) {
    value(names, value_name, help, String | Array, std::move(set), std::move(show));
    impl_->opts.back().kind = Kind::Repeated;
    impl_->opts.back().reset = std::move(reset);
    return *this;
}

Options & Options::action(const std::string & names, const std::string & help, std::function<void()> on) {
    Opt o;
    o.kind = Kind::Action;
    o.help = help;
    o.on = std::move(on);
    impl_->add(std::move(o), names);
    Impl * impl = impl_.get();
    const size_t i = impl->opts.size() - 1;
    impl->app.add_flag_callback(names, [impl, i] { impl->opts[i].on(); })->trigger_on_parse();
    return local();
}

Options & Options::not_resumed() {
    impl_->opts.back().resumed = false;
    return *this;
}

void Options::read_recorded_text(const std::string & text, const std::string & origin) {
    std::vector<RunFileEntry> entries = parse_run_file(text, origin);
    ++impl_->source;
    for (const RunFileEntry & e : entries) {
        const Opt * o = impl_->by_key(e.key);
        if (o && !o->resumed) continue;
        impl_->apply_entry(e, origin);
    }
}

Options & Options::local() {
    impl_->opts.back().local = true;
    return *this;
}

Options & Options::number(const std::string & names, float & target, const std::string & help, const std::string & value_name) {
    return value(names, value_name, help, Int | Float, [&target](const std::string & f, const std::string & v) { target = parse_float(f, v); },
                 [&target] { return std::optional<std::string>(toml_float(target, 9)); });
}

Options & Options::number(const std::string & names, float & target, float lo, float hi, const std::string & help,
                          const std::string & value_name) {
    return value(names, value_name, help, Int | Float,
                 [&target, lo, hi](const std::string & f, const std::string & v) { target = parse_float(f, v, lo, hi); },
                 [&target] { return std::optional<std::string>(toml_float(target, 9)); });
}

Options & Options::number(const std::string & names, double & target, double lo, double hi, const std::string & help,
                          const std::string & value_name) {
    // 17 digits: every double reads back to itself (a run file reproduces the run bit for bit).
    return value(names, value_name, help, Int | Float,
                 [&target, lo, hi](const std::string & f, const std::string & v) { target = parse_double(f, v, lo, hi); },
                 [&target] { return std::optional<std::string>(toml_float(target, 17)); });
}

Options & Options::text(const std::string & names, std::string & target, const std::string & help, const std::string & value_name) {
    return value(names, value_name, help, String, [&target](const std::string &, const std::string & v) { target = v; },
                 [&target] { return target.empty() ? std::nullopt : std::optional<std::string>(toml_string(target)); });
}

Options & Options::text(const std::string & names, std::optional<std::string> & target, const std::string & help,
                        const std::string & value_name) {
    return value(names, value_name, help, String, [&target](const std::string &, const std::string & v) { target = v; },
                 [&target] { return target ? std::optional<std::string>(toml_string(*target)) : std::nullopt; });
}

Options & Options::positionals(const std::string & name, std::vector<std::string> & target, int min, int max, const std::string & help) {
    impl_->positionals = {name, help, &target, min, max};
    impl_->layout.push_back({impl_->group, true, "  " + name + std::string(name.size() + 2 < 28 ? 26 - name.size() : 2, ' ') + help, 0});
    return *this;
}

Options & Options::size(const std::string & names, size_t & target, const std::string & help, bool zero_ok, const std::string & value_name) {
    value(names, value_name, help, Int | String,
                 [&target, zero_ok](const std::string & f, const std::string & v) { target = zero_ok && v == "0" ? 0 : parse_size(f, v); },
                 [&target] { return std::optional<std::string>(std::to_string(target)); });
    impl_->opts.back().bytes = true;
    return *this;
}

Options & Options::sizes(const std::string & names, size_t & each, std::vector<size_t> & list, const std::string & help,
                         const std::string & value_name) {
    value(names, value_name, help, Int | String,
          [&each, &list](const std::string & f, const std::string & v) {
              std::vector<size_t> got;
              for (const std::string & field : split_commas(v, true)) got.push_back(parse_size(f, field));
              if (got.size() == 1) {
                  each = got[0];
                  list.clear();
              } else {
                  list = std::move(got);
              }
          },
          [&each, &list]() -> std::optional<std::string> {
              if (list.empty()) return std::to_string(each);
              std::string s;
              for (size_t b : list) s += (s.empty() ? "" : ",") + size_text(std::to_string(b));
              return toml_string(s);
          });
    impl_->opts.back().bytes = true;
    return *this;
}

Options & Options::choice(const std::string & names, std::string & target, const std::vector<std::string> & allowed, const std::string & help,
                          const std::string & value_name) {
    return value(names, value_name, help, String,
                 [&target, allowed](const std::string & f, const std::string & v) {
                     std::string all;
                     for (const std::string & a : allowed) {
                         if (v == a) {
                             target = v;
                             return;
                         }
                         all += (all.empty() ? "" : ", ") + a;
                     }
                     throw rp::Error(f + ": '" + v + "' is not one of " + all);
                 },
                 [&target] { return target.empty() ? std::nullopt : std::optional<std::string>(toml_string(target)); });
}

Options & Options::list(const std::string & names, std::vector<std::string> & target, const std::string & help, const std::string & value_name) {
    return value(names, value_name, help, String | Array, [&target](const std::string &, const std::string & v) { target = split_commas(v); },
                 [&target] { return target.empty() ? std::nullopt : std::optional<std::string>(toml_array(target)); });
}

Options & Options::run_files() {
    impl_->run_files = true;
    group("");
    value("--config", "FILE",
          "read the options from a run file (TOML: `key = value`, the keys being the long option names without\n"
          "their dashes; the flags given on the command line override it)",
          String, [](const std::string &, const std::string &) {}, [] { return std::nullopt; });
    local();
    return action("--print-config", "print the effective configuration as a run file (for --config) and exit",
                  [this] { print_config_ = true; });
}

void Options::read_run_text(const std::string & text, const std::string & origin) {
    const std::vector<RunFileEntry> entries = parse_run_file(text, origin);
    ++impl_->source;
    for (const RunFileEntry & e : entries) impl_->apply_entry(e, origin);
}

void Options::read_run_file(const std::string & path) { read_run_text(read_file(path), path); }

std::optional<std::string> Options::find(int argc, char ** argv, const std::string & flag) {
    std::optional<std::string> v;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--") break;
        if (a == flag && i + 1 < argc) v = argv[++i];
        else if (a.size() > flag.size() && a.compare(0, flag.size() + 1, flag + "=") == 0) v = a.substr(flag.size() + 1);
    }
    return v;
}

bool Options::parse(int argc, char ** argv) {
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--") break;
        if (a == "-h" || a == "--help") {
            std::fputs(help().c_str(), stdout);
            return false;
        }
    }
    if (impl_->run_files)
        if (const auto path = find(argc, argv, "--config")) read_run_file(*path);
    ++impl_->source;
    try {
        impl_->app.parse(argc, argv);
    } catch (const CLI::ArgumentMismatch & e) {
        const std::string what = e.what();
        throw rp::Error("option " + what.substr(0, what.find(':')) + " needs a value");
    } catch (const CLI::ParseError & e) {
        throw rp::Error(e.what());
    }
    const std::vector<std::string> rest = impl_->app.remaining();
    for (const std::string & r : rest)
        if (r.size() > 1 && r[0] == '-') throw rp::Error("unknown option '" + r + "' (see --help)");
    const Impl::Positionals & pos = impl_->positionals;
    if (!pos.target) {
        if (!rest.empty()) throw rp::Error("unexpected argument '" + rest[0] + "' (options take the form --name VALUE; see --help)");
        return true;
    }
    const int n = static_cast<int>(rest.size());
    if (n < pos.min || (pos.max >= 0 && n > pos.max)) {
        const std::string want = pos.min == pos.max ? std::to_string(pos.min)
                                 : pos.max < 0      ? "at least " + std::to_string(pos.min)
                                                    : std::to_string(pos.min) + " to " + std::to_string(pos.max);
        throw rp::Error(impl_->tool + " takes " + want + " argument" + (pos.max == 1 ? "" : "s") + " (" + pos.name + "), got " +
                        std::to_string(n) + " (see --help)");
    }
    *pos.target = rest;
    return true;
}

std::string Options::help() const {
    std::string out = impl_->usage;
    if (!out.empty() && out.back() != '\n') out += '\n';
    std::vector<std::string> groups;
    for (const Impl::Line & l : impl_->layout)
        if (std::find(groups.begin(), groups.end(), l.group) == groups.end()) groups.push_back(l.group);
    constexpr size_t kColumn = 28;
    const std::string indent(kColumn, ' ');
    for (const std::string & g : groups) {
        if (!g.empty()) out += "\n" + g + ":\n";
        for (const Impl::Line & l : impl_->layout) {
            if (l.group != g) continue;
            if (l.note) {
                out += l.text;
                if (!l.text.empty() && l.text.back() != '\n') out += '\n';
                continue;
            }
            const Opt & o = impl_->opts[l.opt];
            std::string names = "  ";
            names += o.shorts.empty() ? "    " : o.shorts[0] + ", ";
            names += o.longs[0];
            if (o.kind == Kind::Toggle) names += " | " + o.off;
            if (!o.value_name.empty()) names += " " + o.value_name;
            std::string help = o.help;
            // The default, from the variable as declared (a help that states its own default keeps it).
            if (o.show && (o.kind == Kind::Value) && help.find("default") == std::string::npos)
                if (const auto v = o.show()) help += " (default " + (o.bytes ? size_text(*v) : plain(*v)) + ")";
            std::string also;
            for (size_t k = 1; k < o.longs.size(); ++k) also += (also.empty() ? "" : ", ") + o.longs[k];
            for (size_t k = 1; k < o.shorts.size(); ++k) also += (also.empty() ? "" : ", ") + o.shorts[k];
            if (!also.empty()) help += " (also " + also + ")";
            out += names;
            // Names too long for the column: the help starts on the next line, at the column.
            out += names.size() + 2 <= kColumn ? std::string(kColumn - names.size(), ' ') : "\n" + indent;
            for (size_t p = 0, e; p < help.size(); p = e + 1) {
                e = help.find('\n', p);
                if (e == std::string::npos) e = help.size();
                if (p > 0) out += indent;
                out += help.substr(p, e - p) + "\n";
            }
        }
    }
    return out;
}

std::map<std::string, std::string> Options::values(bool resumed_only) const {
    std::map<std::string, std::string> out;
    for (const Opt & o : impl_->opts) {
        if (o.local || o.kind == Kind::Action || !o.show || (resumed_only && !o.resumed)) continue;
        if (const auto v = o.show()) out[o.key()] = *v;
    }
    return out;
}

std::string Options::run_file() const {
    std::string out = "# " + impl_->tool + " run file: the effective configuration (" + impl_->tool +
                      " --config FILE; flags given on the command line override it)\n";
    std::string group = "\x01";
    for (const Impl::Line & l : impl_->layout) {
        if (l.note) continue;
        const Opt & o = impl_->opts[l.opt];
        if (o.local || o.kind == Kind::Action || !o.show) continue;
        if (o.group != group) {
            group = o.group;
            out += "\n# " + (group.empty() ? std::string("general") : group) + "\n";
        }
        if (const auto v = o.show()) out += o.key() + " = " + *v + "\n";
        else out += "# " + o.key() + " =   (not set)\n";
    }
    return out;
}

std::vector<std::string> Options::long_names() const {
    std::vector<std::string> out;
    for (const Opt & o : impl_->opts) {
        out.insert(out.end(), o.longs.begin(), o.longs.end());
        if (o.kind == Kind::Toggle) out.push_back(o.off);
    }
    return out;
}

} // namespace rp::cli
