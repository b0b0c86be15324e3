#include "models/train/preference.h"

#include "models/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <span>

namespace rp {

std::vector<float> preference_values(const Dataset & data, const Batch & bt, const PreferenceParams & p, const std::vector<float> & reference) {
    constexpr int S = kSequenceValues;
    const size_t D = static_cast<size_t>(data.answer_slots()), g = static_cast<size_t>(data.group());
    std::vector<float> v(S * static_cast<size_t>(bt.n_seq) * D, 0.0f);
    double chosen_tokens = 0;
    for (size_t i = 0; i < static_cast<size_t>(bt.n_seq); ++i) {
        const size_t seq = bt.units[i / g] * g + i % g;  // the dataset sequence
        const std::span<const AnswerSlot> answers = data.answers(seq);
        for (size_t j = 0; j < D; ++j) {
            const size_t slot = i * D + j;  // in the batch; seq * D + j in the dataset
            float * vi = v.data() + S * slot;
            vi[kReference] = reference.empty() ? 0.0f : reference[seq * D + j];
            vi[kAnswerTokens] = static_cast<float>(answers[j].tokens);
            vi[kKind] = static_cast<float>(answers[j].kind);
            if (slot % 2 == 0) chosen_tokens += answers[j].tokens;
        }
    }
    if (p.method == PreferenceMethod::Orpo)
        for (size_t c = 0; c < v.size() / S; c += 2)
            if (v[S * c + kAnswerTokens] > 0) v[S * c + kNllWeight] = static_cast<float>(1.0 / chosen_tokens);
    return v;
}

int64_t preference_pairs(const std::vector<float> & values) {
    int64_t n = 0;
    for (size_t c = 0; c < values.size() / kSequenceValues; c += 2) n += preference_pair_present(values.data(), static_cast<int64_t>(c));
    return n;
}

double preference_eval_loss(Trainer & tr, const Dataset & data, const std::vector<uint32_t> & idx, int64_t batch, int threads,
                            const PreferenceParams & p, const std::vector<float> & reference, PreferenceStats & stats) {
    double pair_sum = 0, nll_sum = 0, chosen_tokens = 0;
    stats = {};
    for (size_t b = 0; b < idx.size(); b += static_cast<size_t>(batch)) {
        const size_t e = std::min(idx.size(), b + static_cast<size_t>(batch));
        const Batch bt = make_batch(data, std::span<const uint32_t>(idx.data() + b, e - b));
        const std::vector<float> lp = tr.sequence_logps(bt.inputs.data(), bt.labels.data(), bt.seq_len, bt.n_seq, threads, bt.positions_or_null());
        std::vector<float> sv = preference_values(data, bt, p, reference);
        const int64_t n = static_cast<int64_t>(lp.size());  // answers (slots)
        for (int64_t c = 0; c < n; c += 2) {
            nll_sum -= lp[size_t(c)];  // (0 in an empty slot)
            chosen_tokens += sv[size_t(kSequenceValues * c + kAnswerTokens)];
            sv[size_t(kSequenceValues * c + kNllWeight)] = 0.0f;  // (ORPO's NLL term over the split, below)
        }
        pair_sum += preference_batch_loss(p, lp.data(), sv.data(), n, 1.0, 0.0, nullptr);  // (KTO: each batch's KL)
        stats.add(p, lp.data(), sv.data(), n);
    }
    stats = stats.mean();
    const double pairs = static_cast<double>(stats.pairs);
    // ORPO's NLL term: the chosen answers' cross-entropy, averaged over their tokens (as in training).
    return pair_sum / pairs + (p.method == PreferenceMethod::Orpo ? nll_sum / chosen_tokens : 0.0);
}

void PreferenceStats::add(const PreferenceParams & p, const float * logps, const float * sv, int64_t n_seq) {
    constexpr int S = kSequenceValues;
    auto reward = [&](int64_t b) { return preference_reward(p, logps[b], sv[S * b + kReference], sv[S * b + kAnswerTokens]); };
    if (p.method == PreferenceMethod::Kto) {
        unpaired = true;
        int64_t examples = 0;
        for (int64_t c = 0; c + 1 < n_seq; c += 2) examples += preference_pair_present(sv, c);
        kl += kto_kl(logps, sv, n_seq) * static_cast<double>(examples);  // (weighted by examples: mean() divides)
        for (int64_t c = 0; c + 1 < n_seq; c += 2) {
            if (!preference_pair_present(sv, c)) continue;
            const bool desirable = sv[S * c + kKind] > 0;
            (desirable ? reward_chosen : reward_rejected) += reward(c);
            (desirable ? logp_chosen : logp_rejected) += logps[c];
            ++(desirable ? chosen : rejected);
            ++pairs;
        }
        return;
    }
    for (int64_t c = 0; c + 1 < n_seq; c += 2) {
        if (!preference_pair_present(sv, c)) continue;
        const double rc = reward(c), rr = reward(c + 1);
        reward_chosen += rc;
        reward_rejected += rr;
        accuracy += rc > rr ? 1.0 : 0.0;
        logp_chosen += logps[c];
        logp_rejected += logps[c + 1];
        ++chosen, ++rejected, ++pairs;
    }
}

PreferenceStats PreferenceStats::mean() const {
    PreferenceStats m = *this;
    auto per = [](int64_t n) { return n > 0 ? static_cast<double>(n) : std::nan(""); };
    m.reward_chosen /= per(chosen);
    m.logp_chosen /= per(chosen);
    m.reward_rejected /= per(rejected);
    m.logp_rejected /= per(rejected);
    m.margin = m.reward_chosen - m.reward_rejected;
    m.accuracy = unpaired ? std::nan("") : accuracy / per(pairs);
    m.kl = unpaired ? kl / per(pairs) : 0.0;
    return m;
}

} // namespace rp
