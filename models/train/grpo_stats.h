// What a GRPO step reports (models/train/grpo.h), under TRL's metric names where it has them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace rp {

struct GrpoStats {
    double reward = 0;          // reward: the mean over the step's completions
    double reward_std = 0;      // reward_std: their standard deviation (unbiased, as TRL)
    std::vector<std::pair<std::string, double>> rewards;  // rewards/NAME/mean: each function's mean score
    double frac_reward_zero_std = 0;  // frac_reward_zero_std: the groups whose completions all scored the same
    double completion_mean = 0;       // completions/mean_length, min_length, max_length (tokens, the end token included)
    int64_t completion_min = 0, completion_max = 0;
    double clipped_ratio = 0;   // completions/clipped_ratio: the share that hit the length limit
    double kl = 0;              // kl: the mean k3 estimate over completion tokens (beta > 0; else 0)
    double clip_ratio = 0;      // clip_ratio/region_mean: the share of completion tokens whose ratio the clip held
    std::string sample;         // the step's first completion, as text
    double rollout_seconds = 0; // sampling the completions (the rewards and the reference pass not included)
    int64_t rollout_tokens = 0; // tokens sampled (the prompts' evaluations not counted)
    int32_t iteration = 0;      // which update on the rollout batch (0: the step sampled it; iterations > 1)
};

} // namespace rp
