// A thinking model's reply split into reasoning and answer as it streams (models/reasoning.h), as rp-generate
// --chat shows it: the markers removed with the newlines after them, whatever way the text is cut into
// pieces (a marker split over tokens included); a reply that starts inside the block when the generation
// prompt opened it (DeepSeek-R1), or that never closes it; text that only looks like a marker; and the
// markers found in the real templates llama.cpp ships (Qwen3, QwQ, DeepSeek-R1) and not in ones without.
#include "models/text/chat_template.h"
#include "models/text/reasoning.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Split {
    std::string reasoning, answer;
    int switches = 0;  // reasoning <-> answer transitions between consecutive pieces
};

// The reply fed in pieces cut at `cuts` (byte offsets, ascending).
Split split(const std::string & reply, const std::vector<size_t> & cuts, bool starts_inside) {
    rp::ReasoningSplitter s(rp::ThinkingMarkers{"<think>", "</think>"}, starts_inside);
    Split out;
    int last = -1;
    auto take = [&](const std::vector<rp::ReasoningSplitter::Piece> & ps) {
        for (const auto & p : ps) {
            (p.reasoning ? out.reasoning : out.answer) += p.text;
            if (last >= 0 && last != static_cast<int>(p.reasoning)) ++out.switches;
            last = p.reasoning;
        }
    };
    size_t at = 0;
    for (size_t c : cuts) {
        take(s.feed(reply.substr(at, c - at)));
        at = c;
    }
    take(s.feed(reply.substr(at)));
    take(s.finish());
    return out;
}

} // namespace

TEST(Reasoning, EveryWayOfCuttingTheReplyGivesTheSameSplit) {
    const std::string reply = "<think>\nThe user says hi. <b> is not a marker; </thin neither.\n</think>\n\nHello! 2 < 3.";
    const std::string reasoning = "The user says hi. <b> is not a marker; </thin neither.\n", answer = "Hello! 2 < 3.";
    for (size_t a = 0; a <= reply.size(); ++a)
        for (size_t b = a; b <= reply.size(); b += 7) {
            const Split s = split(reply, {a, b}, false);
            EXPECT_EQ(s.reasoning, reasoning) << "cuts " << a << ", " << b;
            EXPECT_EQ(s.answer, answer) << "cuts " << a << ", " << b;
            EXPECT_EQ(s.switches, 1) << "cuts " << a << ", " << b;
        }
    std::vector<size_t> bytes;  // one byte at a time
    for (size_t i = 1; i < reply.size(); ++i) bytes.push_back(i);
    const Split s = split(reply, bytes, false);
    EXPECT_EQ(s.reasoning, reasoning);
    EXPECT_EQ(s.answer, answer);
}

TEST(Reasoning, RepliesThatStartInsideOrNeverCloseOrNeverThink) {
    // DeepSeek-R1: the generation prompt ends in "<think>\n"; the reply starts inside the block.
    Split s = split("Let me see.\n</think>\n\nYes.", {5, 14}, true);
    EXPECT_EQ(s.reasoning, "Let me see.\n");
    EXPECT_EQ(s.answer, "Yes.");
    // Cut off before the block closes (n_predict): all of it is reasoning, the held-back tail included.
    s = split("<think>\nStill thinking </thi", {9}, false);
    EXPECT_EQ(s.reasoning, "Still thinking </thi");
    EXPECT_EQ(s.answer, "");
    // No block at all, and a reply ending in what could have begun a marker.
    s = split("Just an answer <thin", {3}, false);
    EXPECT_EQ(s.reasoning, "");
    EXPECT_EQ(s.answer, "Just an answer <thin");
    // Qwen3 with enable_thinking = false: the prompt closed an empty block; the reply is the answer.
    EXPECT_FALSE(rp::prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n", {"<think>", "</think>"}));
    EXPECT_TRUE(rp::prompt_opens_thinking("<｜Assistant｜><think>\n", {"<think>", "</think>"}));
    EXPECT_FALSE(rp::prompt_opens_thinking("<|im_start|>assistant\n", {"<think>", "</think>"}));
}

#ifdef RP_CHAT_TEMPLATES_DIR
// The real templates: which have a reasoning block, and where their generation prompt leaves the reply.
TEST(Reasoning, MarkersOfTheTemplatesLlamaCppShips) {
    auto load = [](const char * name) {
        std::ifstream f(std::string(RP_CHAT_TEMPLATES_DIR) + "/" + name + ".jinja", std::ios::binary);
        EXPECT_TRUE(f.good()) << name;
        std::stringstream ss;
        ss << f.rdbuf();
        return rp::ChatTemplate(ss.str(), name);
    };
    struct Case {
        const char * file;
        bool has_block;
        bool opens;  // the generation prompt (enable_thinking default) leaves the reply inside the block
    };
    for (const Case & c : {Case{"Qwen-Qwen3-0.6B", true, false}, Case{"Qwen-QwQ-32B", true, true},
                           Case{"deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", true, true},
                           Case{"Qwen-Qwen2.5-7B-Instruct", false, false}, Case{"google-gemma-2-2b-it", false, false}}) {
        const rp::ChatTemplate t = load(c.file);
        const auto m = rp::thinking_markers(t.source());
        ASSERT_EQ(m.has_value(), c.has_block) << c.file;
        if (!m) continue;
        rp::ChatOptions o;
        o.add_generation_prompt = true;
        const std::string prompt = t.apply({{"user", "hi"}}, o);
        EXPECT_EQ(rp::prompt_opens_thinking(prompt, *m), c.opens) << c.file << ": " << prompt;
        o.enable_thinking = false;  // where the template honours it, the block is closed before the reply
        if (std::string(c.file) == "Qwen-Qwen3-0.6B") {
            EXPECT_FALSE(rp::prompt_opens_thinking(t.apply({{"user", "hi"}}, o), *m)) << c.file;
        }
    }
}
#endif
