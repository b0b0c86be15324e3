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
#include "tools/cli.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

namespace {

void usage(FILE * f) {
    std::fprintf(f,
                 "usage: rp-check -m MODEL.gguf [options]\n"
                 "Runs the reference correctness tests on MODEL: forward and tokenizer against llama.cpp's prebuilt\n"
                 "libraries, gradients against finite differences, a RoundPipe step against the host step, file\n"
                 "round trips. Exit status 0 only when every check that ran passed.\n"
                 "  -m, --model FILE    the model (%s; any weight type)\n"
                 "      --lora FILE     also check this adapter (applied by both engines; its gradients)\n"
                 "      --text FILE     the text the tokens come from (default: a built-in paragraph)\n"
                 "      --quick         fewer tokens and directions, no whole-file copies (~30 s on a 1B model)\n"
                 "      --only LIST     some checks: forward,tokenizer,gradients,pipeline,round-trip\n"
                 "      --json          one JSON object on stdout instead of the table\n"
                 "      --oracle PATH   the rp-oracle program (default: next to rp-check, else $RP_ORACLE_BIN)\n"
                 "  -t, --threads N     CPU threads (default: all)\n" RP_THREADS_WAIT_HELP
                 "  -h, --help          this text\n",
                 rp::supported_architectures().c_str());
}

std::string default_oracle() {
    if (const char * e = std::getenv("RP_ORACLE_BIN"); e && *e) return e;
    std::error_code ec;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) return "";
    const auto p = self.parent_path() / "rp-oracle";
    return std::filesystem::is_regular_file(p, ec) ? p.string() : "";
}

std::string q(const std::string & s) {
    std::string out;
    rp::json::append_string(out, s);
    return out;
}

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
        rp::ModelCheckOptions opt;
        bool json = false;
        std::string text_file;
        opt.oracle = default_oracle();
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            auto value = [&]() -> std::string {
                if (i + 1 >= argc) throw rp::Error("option " + a + " needs a value");
                return argv[++i];
            };
            if (a == "-m" || a == "--model") opt.model = value();
            else if (a == "--lora") opt.lora = value();
            else if (a == "--text") text_file = value();
            else if (a == "--quick") opt.quick = true;
            else if (a == "--json") json = true;
            else if (a == "--oracle") opt.oracle = value();
            else if (a == "-t" || a == "--threads") opt.threads = static_cast<int>(rp::cli::parse_int(a, value(), 0, 4096));
            else if (a == "--only") {
                opt.forward = opt.tokenizer = opt.gradients = opt.pipeline = opt.round_trip = false;
                std::string v = value() + ",";
                for (size_t p = 0, q; (q = v.find(',', p)) != std::string::npos; p = q + 1) {
                    const std::string k = v.substr(p, q - p);
                    if (k == "forward") opt.forward = true;
                    else if (k == "tokenizer") opt.tokenizer = true;
                    else if (k == "gradients") opt.gradients = true;
                    else if (k == "pipeline") opt.pipeline = true;
                    else if (k == "round-trip") opt.round_trip = true;
                    else throw rp::Error("--only: unknown check '" + k + "' (forward, tokenizer, gradients, pipeline, round-trip)");
                }
            }
            else if (a == "-h" || a == "--help") { usage(stdout); return 0; }
            else throw rp::Error("unknown option '" + a + "' (see --help)");
        }
        if (opt.model.empty()) throw rp::Error("no model given (-m MODEL.gguf)");
        if (!text_file.empty()) {
            opt.text = rp::cli::read_file(text_file);
            if (opt.text.empty()) throw rp::Error(text_file + ": is empty");
        }
        if (!opt.oracle.empty() && !std::filesystem::is_regular_file(opt.oracle))
            throw rp::Error("--oracle " + opt.oracle + ": no such program");
        Printer pr{json};
        const std::vector<rp::CheckRow> rows = rp::run_model_checks(opt, print_row, &pr);
        int passed = 0, failed = 0, skipped = 0;
        for (const rp::CheckRow & r : rows) (r.status == rp::CheckStatus::Pass ? passed : r.status == rp::CheckStatus::Fail ? failed : skipped)++;
        if (json) {
            std::string s = "{\"model\": " + q(opt.model) + ", \"passed\": " + std::to_string(passed) +
                            ", \"failed\": " + std::to_string(failed) + ", \"skipped\": " + std::to_string(skipped) + ", \"checks\": [";
            for (size_t i = 0; i < rows.size(); ++i) {
                const rp::CheckRow & r = rows[i];
                s += std::string(i ? ", " : "") + "{\"check\": " + q(r.check) + ", \"what\": " + q(r.what) +
                     ", \"figure\": " + q(r.figure) + ", \"tolerance\": " + q(r.tolerance) +
                     ", \"result\": " + q(rp::check_status_name(r.status)) + ", \"detail\": " + q(r.note) +
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
