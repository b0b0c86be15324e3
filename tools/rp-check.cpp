// rp-check: the reference correctness tests on the user's own model (models/model_check.h).
//
//   rp-check -m MODEL.gguf [--lora ADAPTER.gguf] [--text FILE] [--quick] [--json] [--oracle PATH] [-t N]
//
// Prints a table (check, what, figure, tolerance, result) as the checks run, and exits 0 only if every check
// that ran passed (skipped ones say why; a run where everything was skipped exits 1 too).
#include "base/error.h"
#include "ggml_rp/core/json.h"
#include "models/arch/hparams.h"
#include "models/check/model_check.h"
#include "tools/check_options.h"

#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {

struct Printer {
    bool json;
    bool header = false;
};

void print_row(const rp::CheckRow & r, void * user) {
    Printer & p = *static_cast<Printer *>(user);
    if (p.json) return;
    if (!p.header) {  // with the first row: a model that cannot be read prints nothing on stdout
        std::printf("%-10s %-62s %-18s %-14s %-7s %6s  %s\n", "check", "what", "figure", "tolerance", "result", "time", "detail");
        p.header = true;
    }
    std::printf("%-10s %-62s %-18s %-14s %-7s %5.1fs  %s\n", r.check.c_str(), r.what.c_str(), r.figure.c_str(),
                r.tolerance.c_str(), rp::check_status_name(r.status), r.seconds, r.note.c_str());
    std::fflush(stdout);
}

} // namespace

int main(int argc, char ** argv) {
    try {
        rp::cli::CheckSettings settings;
        rp::cli::Options opts("rp-check",
                              "usage: rp-check -m MODEL.gguf [options]\n"
                              "Runs the reference correctness tests on MODEL: forward and tokenizer against llama.cpp's prebuilt\n"
                              "libraries, gradients against finite differences, a RoundPipe step against the host step, file\n"
                              "round trips. Exit status 0 only when every check that ran passed.");
        rp::cli::declare_check_options(opts, settings);
        if (!opts.parse(argc, argv)) return 0;
        settings.validate();
        rp::ModelCheckOptions & opt = settings.check;
        const bool json = settings.json;
        if (!settings.text_file.empty()) {
            opt.text = rp::cli::read_file(settings.text_file);
            if (opt.text.empty()) throw rp::Error(settings.text_file + ": is empty");
        }
        Printer pr{json};
        const std::vector<rp::CheckRow> rows = rp::run_model_checks(opt, print_row, &pr);
        int passed = 0, failed = 0, skipped = 0;
        for (const rp::CheckRow & r : rows) (r.status == rp::CheckStatus::Pass ? passed : r.status == rp::CheckStatus::Fail ? failed : skipped)++;
        if (json) {
            std::string s = "{\"model\": " + rp::json::quoted(opt.model) + ", \"passed\": " + std::to_string(passed) +
                            ", \"failed\": " + std::to_string(failed) + ", \"skipped\": " + std::to_string(skipped) + ", \"checks\": [";
            for (size_t i = 0; i < rows.size(); ++i) {
                const rp::CheckRow & r = rows[i];
                s += std::string(i ? ", " : "") + "{\"check\": " + rp::json::quoted(r.check) + ", \"what\": " + rp::json::quoted(r.what) +
                     ", \"figure\": " + rp::json::quoted(r.figure) + ", \"tolerance\": " + rp::json::quoted(r.tolerance) +
                     ", \"result\": " + rp::json::quoted(rp::check_status_name(r.status)) + ", \"detail\": " + rp::json::quoted(r.note) +
                     ", \"seconds\": " + std::to_string(r.seconds) + "}";
            }
            std::printf("%s]}\n", s.c_str());
        } else {
            std::printf("\n%d passed, %d failed, %d skipped\n", passed, failed, skipped);
        }
        if (std::fflush(stdout) != 0) throw rp::Error("cannot write to standard output");
        return failed == 0 && passed > 0 ? 0 : 1;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
