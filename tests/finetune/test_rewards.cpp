// GRPO's rewards (models/train/rewards.h): the answer extraction exact: compares, the built-ins, weighted sums, and
// the user's reward program driven through its stdin and stdout (shell scripts here): the lines it is sent, a
// process kept across batches, and every way it can fail (exits, hangs past the timeout, prints a non-number or
// too few lines), each an error naming it, never a silent 0.
#include "base/error.h"
#include "models/train/rewards.h"
#include "tests/common/temp_dir.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <csignal>
#include <fstream>
#include <unistd.h>
#include <string>
#include <vector>

namespace {

struct Examples {
    std::vector<rp::json::Value> values;
    std::vector<rp::RewardInput> batch;
    // Completions with their example lines (JSON objects).
    Examples(const std::vector<std::string> & completions, const std::vector<std::string> & lines) {
        for (size_t i = 0; i < lines.size(); ++i) values.push_back(rp::json::parse(lines[i], "test"));
        for (size_t i = 0; i < completions.size(); ++i) {
            rp::RewardInput in;
            in.prompt = std::to_string(i);
            in.prompt.insert(in.prompt.begin(), 'Q');  // (not "Q" + ...: GCC 12 warns falsely, -Wrestrict)
            in.completion = completions[i];
            in.example = &values[i % values.size()];
            in.where = "prompts.jsonl line " + std::to_string(i % values.size() + 1);
            in.tokens = static_cast<int64_t>(completions[i].size());
            in.finished = i % 2 == 0;
            batch.push_back(in);
        }
    }
};

std::string error_of(rp::RewardFunction & f, const std::vector<rp::RewardInput> & batch) {
    try {
        f.score(batch);
    } catch (const rp::Error & e) {
        return e.what();
    }
    return "";
}

// A reward program from a shell script body.
std::string script(rp_test::TempDir & dir, const std::string & name, const std::string & body) {
    const std::string path = dir.file(name);
    std::ofstream(path) << body;
    return "sh " + path;
}

} // namespace

TEST(RewardAnswer, TheLastBoxedAnswerElseTheLastNumber) {
    EXPECT_EQ(rp::extract_answer("so the answer is \\boxed{42}."), "42");
    EXPECT_EQ(rp::extract_answer("\\boxed{1} then \\boxed{\\frac{1}{2}}"), "\\frac{1}{2}");
    EXPECT_EQ(rp::extract_answer("1,234.5 apples and then 7 pears"), "7");
    EXPECT_EQ(rp::extract_answer("it is -1,234.50"), "-1234.50");
    EXPECT_EQ(rp::extract_answer("no digits"), "");
    EXPECT_EQ(rp::extract_answer("\\boxed{unclosed 5"), "5");
}

TEST(RewardBuiltins, ExactRegexAndLength) {
    Examples ex({"the answer is 4", "\\boxed{4.0}", "5", "Paris", " paris"},
                {R"({"prompt": "2+2", "answer": 4})", R"({"prompt": "2+2", "answer": "4"})", R"({"prompt": "2+2", "answer": "4"})",
                 R"({"prompt": "capital", "answer": " Paris "})", R"({"prompt": "capital", "answer": "Paris"})"});
    auto exact = rp::make_builtin_reward("exact:answer");
    EXPECT_EQ(exact->name(), "exact:answer");
    EXPECT_EQ(exact->score(ex.batch), (std::vector<double>{1, 1, 0, 1, 0}));
    auto re = rp::make_builtin_reward("regex:^[[:space:]]*[Pp]aris$");
    EXPECT_EQ(re->score(ex.batch), (std::vector<double>{0, 0, 0, 1, 1}));
    auto len = rp::make_builtin_reward("length:5");  // finished (even indices) within 5 tokens (here: characters)
    EXPECT_EQ(len->score(ex.batch), (std::vector<double>{0, 0, 1, 0, 0}));
    // A missing field names the example.
    Examples missing({"4"}, {R"({"prompt": "2+2", "solution": 4})"});
    EXPECT_NE(error_of(*exact, missing.batch).find("exact:answer: prompts.jsonl line 1 has no string or number field \"answer\""),
              std::string::npos);
    // A long completion: no recursion to overflow (std::regex's matcher would).
    Examples long_text({std::string(200000, 'a') + "b"}, {R"({"prompt": "p"})"});
    EXPECT_EQ(rp::make_builtin_reward("regex:a(a|c)*b$")->score(long_text.batch), (std::vector<double>{1}));
    for (const char * bad : {"exact:", "regex:(", "length:0", "length:2.5", "bleu:x", "exact"}) EXPECT_THROW(rp::make_builtin_reward(bad), rp::Error) << bad;
    // Weighted sums, and each function's scores.
    rp::RewardSet set;
    set.add(rp::make_builtin_reward("exact:answer"), 1.0);
    set.add(rp::make_builtin_reward("regex:aris"), -0.5);
    std::vector<std::vector<double>> each;
    EXPECT_EQ(set.score(ex.batch, &each), (std::vector<double>{1, 1, 0, 0.5, -0.5}));
    ASSERT_EQ(each.size(), 2u);
    EXPECT_EQ(each[1], (std::vector<double>{0, 0, 0, 1, 1}));
}

// The program reads one JSON line per completion, with the example's other fields as they are, and answers one
// number per line; it keeps running across batches (its counter goes on).
TEST(RewardProgram, ScoresThroughStdinAndStdoutAndKeepsRunning) {
    rp_test::TempDir dir;
    const std::string cmd = script(dir, "count.sh",
                                   "n=0\n"
                                   "while IFS= read -r line; do\n"
                                   "  n=$((n + 1))\n"
                                   "  case \"$line\" in\n"
                                   "    *'\"completion\": \"a dog\"'*'\"id\": 7'*) echo \"$n.5\" ;;\n"
                                   "    *) echo \"$n\" ;;\n"
                                   "  esac\n"
                                   "done\n");
    auto prog = rp::make_reward_program(cmd, 30);
    EXPECT_EQ(prog->name(), "cmd:" + cmd);
    Examples a({"a cat", "a dog", "x"}, {R"({"prompt": "p", "id": 7, "meta": {"k": [1, "two"]}})"});
    EXPECT_EQ(prog->score(a.batch), (std::vector<double>{1, 2.5, 3}));
    Examples b({"a dog", "y"}, {R"({"prompt": "p", "id": 8})"});
    EXPECT_EQ(prog->score(b.batch), (std::vector<double>{4, 5}));
    // What it was sent: the prompt, the completion, then the example's other fields (prompt not repeated).
    const std::string echo = script(dir, "echo.sh", "while IFS= read -r line; do printf '%s\\n' \"$line\" >> " + dir.file("seen.txt") + "; echo 0; done\n");
    auto rec = rp::make_reward_program(echo, 30);
    rec->score(a.batch);
    std::ifstream seen(dir.file("seen.txt"));
    std::string first;
    std::getline(seen, first);
    EXPECT_EQ(first, R"({"prompt": "Q0", "completion": "a cat", "id": 7, "meta": {"k": [1, "two"]}})");
}

TEST(RewardProgram, EveryFailureIsAnErrorNamingIt) {
    rp_test::TempDir dir;
    Examples ex({"a", "b", "c"}, {R"({"prompt": "p"})"});
    // The timeout: 0.5 s for the program that hangs; 60 s for the others, whose failures must not depend on how
    // soon a loaded machine runs them.
    struct Case {
        const char * body;
        const char * want;
        double timeout = 60;
    };
    for (const Case & c : {Case{"read -r l; echo 1; exit 3\n", "exited with status 3 before it scored every completion (1 of 3 scores"},
                           Case{"read -r l; echo 1\n", "exited with status 0 before it scored every completion (1 of 3 scores"},
                           Case{"while read -r l; do echo banana; done\n", "its answer for completion 1 (prompts.jsonl line 1), \"banana\", is not a finite number"},
                           Case{"while read -r l; do echo nan; done\n", "\"nan\", is not a finite number"},
                           Case{"read -r l; echo 1; sleep 30\n", "gave no answer within the timeout of 0.5 s and was killed", 0.5},
                           Case{"exit 2\n", "exited with status 2"}}) {
        SCOPED_TRACE(c.body);
        const std::string cmd = script(dir, "fail.sh", c.body);
        auto prog = rp::make_reward_program(cmd, c.timeout);
        const std::string e = error_of(*prog, ex.batch);
        EXPECT_NE(e.find("reward program '" + cmd + "'"), std::string::npos) << e;
        EXPECT_NE(e.find(c.want), std::string::npos) << e;
    }
    // A hung program is killed with what it started (here a `sleep` it waits for, which would keep our stderr open).
    {
        // (its `sleep` is started and named before it answers the first line: "1 of 3" says it ran that far; 3 s for
        // a loaded machine to get it there)
        const std::string cmd = script(dir, "bg.sh", "sleep 60 & echo $! > " + dir.file("sleep.pid") + "; read -r l; echo 1; wait\n");
        auto prog = rp::make_reward_program(cmd, 3);
        EXPECT_NE(error_of(*prog, ex.batch).find("gave no answer within the timeout of 3 s and was killed (1 of 3 scores"), std::string::npos);
        std::ifstream f(dir.file("sleep.pid"));
        pid_t pid = 0;
        ASSERT_TRUE(f >> pid);
        auto gone = [&] {  // no such process, or a zombie (killed, not yet reaped by whoever adopted it)
            if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
            std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
            std::string pid_text, comm, state;
            return stat >> pid_text >> comm >> state && state == "Z";
        };
        bool dead = gone();
        for (int i = 0; i < 1000 && !dead; ++i) {  // (SIGKILL's delivery is asynchronous: wait for it, up to 10 s)
            ::usleep(10000);
            dead = gone();
        }
        EXPECT_TRUE(dead) << "the program's sleep " << pid << " is still running";
    }
    // One that exits after a batch fails the next one.
    const std::string once = script(dir, "once.sh", "read -r l; echo 1\n");
    auto prog = rp::make_reward_program(once, 60);
    Examples one({"a"}, {R"({"prompt": "p"})"});
    EXPECT_EQ(prog->score(one.batch), (std::vector<double>{1}));
    const std::string e = error_of(*prog, one.batch);
    EXPECT_NE(e.find("exited with status 0"), std::string::npos) << e;
    EXPECT_THROW(rp::make_reward_program("  ", 5), rp::Error);
    EXPECT_THROW(rp::make_reward_program("cat", 0), rp::Error);
}
