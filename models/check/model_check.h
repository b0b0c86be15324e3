// The reference correctness checks on any model (rp-check): what the test suite checks on our files, run on
// the user's. Each check adds rows (what, the figure measured, the tolerance, pass / fail / skipped).
//
//   forward    our logits vs llama.cpp's on the same tokens (rp-oracle, the prebuilt libraries), tolerance by
//              the model's weight types; top-1 agreement; greedy continuation (with --lora: both engines
//              apply the adapter at run time)
//   tokenizer  our token ids vs llama.cpp's on the text and on strings that stress tokenizers (unicode,
//              whitespace runs, digits, the model's special tokens)
//   gradients  the analytic gradient of the training loss vs finite differences (gradient_check.h), one tensor
//              of each kind, LoRA factors
//   pipeline   one LoRA step through 2 RoundPipe virtual devices bitwise equal to the host step (and a full
//              finetune step when the model is small)
//   round trip our GGUF writer rewrites the file's metadata and tensors byte for byte; a merge of a small
//              random adapter gives llama.cpp the logits of base + adapter
// The llama.cpp parts need the rp-oracle program (scripts/fetch-oracle.sh, then reconfigure): without it they
// are reported as skipped, saying how to get it — never as passed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rp {

enum class CheckStatus { Pass, Fail, Skipped };
const char * check_status_name(CheckStatus s);  // "pass", "FAIL", "skipped"

struct CheckRow {
    std::string check;      // "forward", "tokenizer", "gradients", ...
    std::string what;       // e.g. "max |logit diff| / logit range", "blk.14.attn_q.weight"
    std::string figure;     // the number measured, formatted
    std::string tolerance;  // what passes, e.g. "<= 1e-4"
    CheckStatus status = CheckStatus::Pass;
    std::string note;       // why skipped, or the detail of a failure
    double seconds = 0;
};

struct ModelCheckOptions {
    std::string model;
    std::string lora;       // optional adapter
    std::string text;       // the text for tokens (contents); empty: a built-in paragraph
    std::string oracle;     // the rp-oracle program; empty: not available
    bool quick = false;     // fewer tokens and directions, no whole-file rewrites
    int threads = 0;
    // which checks (all by default)
    bool forward = true, tokenizer = true, gradients = true, pipeline = true, round_trip = true;
};

// Runs the checks; `on_row` (may be empty) sees each row as it is decided (progress). Throws rp::Error only for
// input that prevents every check (an unreadable model or adapter).
std::vector<CheckRow> run_model_checks(const ModelCheckOptions & opt, void (*on_row)(const CheckRow &, void *) = nullptr,
                                       void * user = nullptr);

} // namespace rp
