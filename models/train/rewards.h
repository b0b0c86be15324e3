// Rewards for reinforcement learning with verifiable rewards (GRPO): built-in checks of a completion against its
// example's fields, and the user's own program. A reward function scores a rollout batch's completions in order;
// several are summed with weights (RewardSet).
//
// Built-ins (RewardSet::add's spec):
//   exact:FIELD    1 when the completion's answer equals the example's FIELD, else 0. The answer is the content
//                  of the completion's last \boxed{...}; else, when FIELD is a number (or a string that is one),
//                  the completion's last number (thousands separators dropped); else the whole completion. Two
//                  numbers compare as numbers (|a - b| <= 1e-9 max(1, |b|)), anything else as trimmed text.
//   regex:PATTERN  1 when PATTERN (a POSIX extended regular expression) matches somewhere in the completion.
//   length:N       1 when the completion ended by itself (end of generation or a stop string) within N tokens.
// A program (RewardProgram; rp-finetune --reward-cmd): started once with /bin/sh -c COMMAND and kept running; for
// every completion it reads one JSON line on its stdin, {"prompt": P, "completion": C, ...the example's other
// fields as they are in its line}, and writes one number per line on its stdout, in order (its stderr is ours).
// Whatever it does wrong stops the run with an rp::Error naming it: it exits, its line is not a number (nan and
// inf included), it writes fewer lines than it was sent before it exits, or it does not answer within the timeout
// (it is then killed). It is never silently scored 0.
#pragma once

#include "ggml_rp/core/json.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace rp {

// A completion to score, with what it answers.
struct RewardInput {
    std::string prompt;       // the prompt's text as rendered
    std::string completion;   // the completion's text
    const json::Value * example = nullptr;  // the prompt's JSONL object (its fields)
    std::string where;        // the example's file and line, for messages ("prompts.jsonl line 7")
    int64_t tokens = 0;       // the completion's tokens
    bool finished = false;    // it ended by itself (end of generation, a stop string), not at the length limit
};

class RewardFunction {
public:
    virtual ~RewardFunction() = default;
    // Its name in the log and the metrics ("exact:answer", "regex:...", "length:64", "cmd:COMMAND").
    virtual const std::string & name() const = 0;
    // One score per input, in order; throws rp::Error when it cannot score (a missing field, a failing program).
    virtual std::vector<double> score(const std::vector<RewardInput> & batch) = 0;
};

// The built-in named by spec ("exact:FIELD", "regex:PATTERN", "length:N"); throws rp::Error for any other spec,
// an empty field, a pattern that does not compile, N < 1.
std::unique_ptr<RewardFunction> make_builtin_reward(const std::string & spec);

// The user's program (see above); timeout_s > 0 bounds each batch's answers.
std::unique_ptr<RewardFunction> make_reward_program(const std::string & command, double timeout_s);

// The answer exact: compares with a number: the content of the last \boxed{...} of text, else its last number
// ("" when none).
std::string extract_answer(const std::string & text);

// Several reward functions, each with its weight: the reward of a completion is sum_i weight_i score_i.
class RewardSet {
public:
    void add(std::unique_ptr<RewardFunction> f, double weight);
    size_t size() const { return fns_.size(); }
    const RewardFunction & function(size_t i) const { return *fns_[i]; }
    double weight(size_t i) const { return weights_[i]; }
    // Per completion the weighted sum, and per function its scores (scores[i][k]: function i, completion k).
    std::vector<double> score(const std::vector<RewardInput> & batch, std::vector<std::vector<double>> * scores = nullptr);

private:
    std::vector<std::unique_ptr<RewardFunction>> fns_;
    std::vector<double> weights_;
};

} // namespace rp
