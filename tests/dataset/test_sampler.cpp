// Seeded shuffling, the train / validation split, batches over epochs and resuming from a saved position.
#include "dataset_test_util.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

using namespace ds_test;

namespace {

const rp::Dataset & train_txt() {
    static const rp::Dataset d = [] {
        rp::DatasetOptions o;
        o.seq_len = 16;
        return rp::Dataset::from_text(read_file(models_dir() + "/reference/train.txt"), "train.txt", stories(), o);
    }();
    return d;
}

std::vector<uint32_t> iota(size_t n) {
    std::vector<uint32_t> v(n);
    std::iota(v.begin(), v.end(), 0u);
    return v;
}

TEST(Shuffle, UsesTheStandardGeneratorAndPlainModulo) {
    // The C++ standard fixes mt19937_64's 10000th output for the default seed.
    std::mt19937_64 g;
    g.discard(9999);
    EXPECT_EQ(g(), 9981545732273789042ull);
    // n a power of two: no rejection, x mod n.
    std::mt19937_64 a(5), b(5);
    for (int i = 0; i < 100; ++i) EXPECT_EQ(rp::uniform_below(a, 8), b() % 8);
    // n = 2^63 + 1: 2^64 mod n = 2^63 - 1, so draws above 2^63 are rejected.
    const uint64_t n = (1ull << 63) + 1;
    std::mt19937_64 c(9), ref(9);
    int rejected = 0;
    for (int i = 0; i < 200; ++i) {
        uint64_t x = ref();
        while (x > (1ull << 63)) {
            x = ref();
            ++rejected;
        }
        ASSERT_EQ(rp::uniform_below(c, n), x % n);
    }
    EXPECT_GT(rejected, 50);  // about half the draws: the rejection path really ran
}

TEST(Shuffle, ReproducibleUniformPermutations) {
    std::vector<uint32_t> a = iota(50), b = iota(50), c = iota(50);
    rp::shuffle_indices(a, 123);
    rp::shuffle_indices(b, 123);
    rp::shuffle_indices(c, 124);
    EXPECT_EQ(a, b);
    EXPECT_NE(a, c);
    std::vector<uint32_t> s = a;
    std::sort(s.begin(), s.end());
    EXPECT_EQ(s, iota(50));
    // All 6 orders of 3 items, each about 1/6 of 6000 seeds (a chi-square bound far from the mean's noise).
    std::map<std::vector<uint32_t>, int> count;
    for (uint64_t seed = 0; seed < 6000; ++seed) {
        std::vector<uint32_t> p = iota(3);
        rp::shuffle_indices(p, rp::mix_seed(seed, 0));
        ++count[p];
    }
    ASSERT_EQ(count.size(), 6u);
    double chi2 = 0;
    for (const auto & kv : count) chi2 += (kv.second - 1000.0) * (kv.second - 1000.0) / 1000.0;
    EXPECT_LT(chi2, 20.5);  // p = 0.001 for 5 degrees of freedom
}

TEST(Split, IsAPartition) {
    for (const double f : {0.0, 0.1, 0.25, 0.5, 0.001}) {
        const rp::DatasetSplit s = rp::split_dataset(40, f, 7);
        std::vector<uint32_t> all = s.train;
        all.insert(all.end(), s.val.begin(), s.val.end());
        std::sort(all.begin(), all.end());
        EXPECT_EQ(all, iota(40)) << f;
        EXPECT_TRUE(std::is_sorted(s.train.begin(), s.train.end()));
        EXPECT_TRUE(std::is_sorted(s.val.begin(), s.val.end()));
        const size_t want = f == 0.0 ? 0 : std::max<size_t>(1, static_cast<size_t>(std::llround(f * 40)));
        EXPECT_EQ(s.val.size(), want) << f;
    }
    const rp::DatasetSplit a = rp::split_dataset(40, 0.25, 7), b = rp::split_dataset(40, 0.25, 7),
                           c = rp::split_dataset(40, 0.25, 8);
    EXPECT_EQ(a.val, b.val);
    EXPECT_NE(a.val, c.val);
    EXPECT_THROW(rp::split_dataset(40, 1.0, 7), rp::Error);
    EXPECT_THROW(rp::split_dataset(40, -0.1, 7), rp::Error);
    EXPECT_THROW(rp::split_dataset(1, 0.5, 7), rp::Error);  // nothing left to train on
}

TEST(Batcher, EpochsVisitEverySequenceOnce) {
    const rp::Dataset & d = train_txt();
    const rp::DatasetSplit s = rp::split_dataset(d.size(), 0.2, 1);
    const size_t n = s.train.size();
    ASSERT_GE(n, 10u);
    for (const int32_t B : {1, 3, static_cast<int32_t>(n) + 5}) {
        rp::Batcher bt(d, s.train, B, 99);
        // Identify each sequence of the stream by its row in the dataset (rows are distinct here).
        std::vector<uint32_t> stream;
        while (stream.size() < 3 * n) {
            const rp::Batch b = bt.next();
            ASSERT_EQ(b.n_seq, B);
            ASSERT_EQ(b.seq_len, 16);
            for (int32_t k = 0; k < B; ++k) {
                const std::vector<int32_t> in(b.inputs.begin() + k * 16, b.inputs.begin() + (k + 1) * 16);
                uint32_t found = UINT32_MAX;
                for (const uint32_t i : s.train) {
                    if (row(d.inputs(i)) == in) found = i;
                }
                ASSERT_NE(found, UINT32_MAX);
                const std::vector<int32_t> lab(b.labels.begin() + k * 16, b.labels.begin() + (k + 1) * 16);
                ASSERT_EQ(lab, row(d.labels(found)));
                stream.push_back(found);
            }
        }
        std::vector<std::vector<uint32_t>> epochs;
        for (size_t e = 0; e < 3; ++e) {
            std::vector<uint32_t> ep(stream.begin() + e * n, stream.begin() + (e + 1) * n);
            epochs.push_back(ep);
            std::sort(ep.begin(), ep.end());
            EXPECT_EQ(ep, s.train) << "epoch " << e << " batch " << B;  // a permutation of the train part
        }
        EXPECT_NE(epochs[0], epochs[1]);  // a new order every epoch
        EXPECT_NE(epochs[0], s.train);    // shuffled
    }
}

TEST(Batcher, SeedDecidesTheOrder) {
    const rp::Dataset & d = train_txt();
    const std::vector<uint32_t> all = iota(d.size());
    rp::Batcher a(d, all, 4, 1), b(d, all, 4, 1), c(d, all, 4, 2), plain(d, all, 4, 1, false);
    const rp::Batch ba = a.next(), bb = b.next(), bc = c.next(), bp = plain.next();
    EXPECT_EQ(ba.inputs, bb.inputs);
    EXPECT_EQ(ba.labels, bb.labels);
    EXPECT_NE(ba.inputs, bc.inputs);
    const rp::Batch first4 = rp::make_batch(d, std::vector<uint32_t>{0, 1, 2, 3});
    EXPECT_EQ(bp.inputs, first4.inputs);  // no shuffling: dataset order
    EXPECT_EQ(first4.n_trained(), 64u);   // train.txt's first 64 labels are all real tokens
}

TEST(Batcher, ResumeFromSavedPosition) {
    const rp::Dataset & d = train_txt();
    const rp::DatasetSplit s = rp::split_dataset(d.size(), 0.1, 3);
    rp::Batcher a(d, s.train, 5, 42);
    std::vector<rp::Batch> ref;
    rp::DataPosition saved;
    for (int i = 0; i < 12; ++i) {  // crosses several epoch bounds
        if (i == 7) saved = a.position();
        ref.push_back(a.next());
    }
    EXPECT_EQ(saved.consumed, 35u);
    rp::Batcher b(d, s.train, 5, 42);
    b.seek(saved);
    EXPECT_EQ(b.epoch(), 35 / s.train.size());
    for (int i = 7; i < 12; ++i) {
        const rp::Batch x = b.next();
        EXPECT_EQ(x.inputs, ref[i].inputs) << i;
        EXPECT_EQ(x.labels, ref[i].labels) << i;
    }
    // A position from another seed or another split is refused.
    rp::Batcher other_seed(d, s.train, 5, 43);
    EXPECT_NE(error_of([&] { other_seed.seek(saved); }).find("seed 42"), std::string::npos);
    rp::Batcher other_split(d, rp::split_dataset(d.size(), 0.1, 4).train, 5, 42);
    EXPECT_NE(error_of([&] { other_split.seek(saved); }).find("fingerprint"), std::string::npos);
    EXPECT_THROW(rp::Batcher(d, {}, 5, 1), rp::Error);
    EXPECT_THROW(rp::Batcher(d, s.train, 0, 1), rp::Error);
}

} // namespace
