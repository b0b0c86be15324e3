// Preference training's host side (the loss itself is ops/preference_loss.h, the head program the Trainer's):
// each sequence's values for the head, the validation loss, and the metrics under TRL's names.
#pragma once

#include "ggml_rp/ops/preference_math.h"
#include "models/data/dataset.h"

#include <cstdint>
#include <vector>

namespace rp {

class Trainer;

// Preference training's metrics, under TRL's names: means over the pairs (KTO: examples) of a step or of the
// validation split. The rewards are ops/preference_math.h's preference_reward (DPO: beta (policy - reference)).
struct PreferenceStats {
    double reward_chosen = 0;    // rewards/chosen (KTO: of the desirable examples)
    double reward_rejected = 0;  // rewards/rejected (KTO: of the undesirable ones)
    double margin = 0;           // rewards/margins: chosen - rejected
    double accuracy = 0;         // rewards/accuracies: the share of pairs whose chosen reward is the larger (NaN for KTO)
    double logp_chosen = 0;      // logps/chosen: the policy's summed log-probability of the chosen answers
    double logp_rejected = 0;    // logps/rejected
    double kl = 0;               // KTO: the KL reference point (over the whole batch; the losses use each micro-batch's)
    int64_t pairs = 0;           // pairs, or KTO examples
    int64_t chosen = 0, rejected = 0;  // answers in the chosen and rejected means
    bool unpaired = false;       // KTO
    // Adds the pairs (examples) of n_seq sequences (packed: answer slots, the empty ones skipped): their policy
    // log-probabilities and values (kSequenceValues each; sums: mean() divides).
    void add(const PreferenceParams & p, const float * logps, const float * sequence_values, int64_t n_seq);
    PreferenceStats mean() const;
};

// Each answer of batch bt's values (ops/preference_math.h SequenceValue, kSequenceValues floats each), per
// sequence, or per answer slot of packed data (Dataset::answer_slots() per sequence; an empty slot's are 0): its
// reference log-probability (reference: per dataset slot, Dataset::n_answer_slots(); empty: 0), answer tokens, NLL
// weight (ORPO: the chosen answers' NLL averaged over the batch's chosen tokens, as TRL) and kind (KTO: the
// example's +1 desirable / -1 undesirable, its KL sequence 0).
std::vector<float> preference_values(const Dataset & data, const Batch & bt, const PreferenceParams & p, const std::vector<float> & reference);
// The pairs (KTO: examples) among such values: the non-empty slot pairs.
int64_t preference_pairs(const std::vector<float> & values);

// The mean loss of the pairs (KTO: examples, each evaluation batch its own KL) of units idx at the trainer's
// current weights, in batches of `batch` units (forward only, on the host), and their metrics in *stats; ORPO's
// NLL term is averaged over all the chosen tokens of idx.
double preference_eval_loss(Trainer & tr, const Dataset & data, const std::vector<uint32_t> & idx, int64_t batch, int threads,
                            const PreferenceParams & p, const std::vector<float> & reference, PreferenceStats & stats);

} // namespace rp
