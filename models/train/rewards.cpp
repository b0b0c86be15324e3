#include "models/train/rewards.h"

#include "base/error.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <regex.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <poll.h>
#include <signal.h>
#include <thread>
#include <unistd.h>

extern char ** environ;

namespace rp {

namespace {

std::string trim(const std::string & s) {
    const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// s as a whole finite number, or false.
bool parse_number(const std::string & s, double & out) {
    const std::string t = trim(s);
    if (t.empty()) return false;
    char * end = nullptr;
    errno = 0;
    out = std::strtod(t.c_str(), &end);
    return end == t.c_str() + t.size() && errno == 0 && std::isfinite(out);
}

// The content of text's last \boxed{...} (its braces balanced), trimmed.
bool last_boxed(const std::string & text, std::string & out) {
    const size_t at = text.rfind("\\boxed{");
    if (at == std::string::npos) return false;
    int depth = 1;
    for (size_t i = at + 7; i < text.size(); ++i) {
        if (text[i] == '{') ++depth;
        if (text[i] == '}' && --depth == 0) {
            out = trim(text.substr(at + 7, i - at - 7));
            return true;
        }
    }
    return false;
}

// text's last number: digits with optional thousands separators and decimals, a sign before it (the separators
// dropped); "" when it has none.
std::string last_number(const std::string & text) {
    auto digit = [&](size_t i) { return i < text.size() && text[i] >= '0' && text[i] <= '9'; };
    std::string last;
    for (size_t i = 0; i < text.size();) {
        if (!digit(i)) {
            ++i;
            continue;
        }
        const size_t start = i > 0 && text[i - 1] == '-' ? i - 1 : i;
        size_t j = i;
        while (digit(j) || (j < text.size() && text[j] == ',')) ++j;
        if (j < text.size() && text[j] == '.' && digit(j + 1))
            for (++j; digit(j);) ++j;
        last = text.substr(start, j - start);
        i = j;
    }
    last.erase(std::remove(last.begin(), last.end(), ','), last.end());
    return last;
}

class ExactAnswer : public RewardFunction {
public:
    explicit ExactAnswer(std::string field) : field_(std::move(field)), name_("exact:" + field_) {}
    const std::string & name() const override { return name_; }
    std::vector<double> score(const std::vector<RewardInput> & batch) override {
        std::vector<double> out;
        for (const RewardInput & in : batch) {
            const json::Value * v = in.example ? in.example->find(field_) : nullptr;
            if (!v || !(v->is_string() || v->is_number()))
                throw Error(name_ + ": " + in.where + " has no string or number field \"" + field_ + "\" to compare with");
            double a = 0, b = 0;
            const bool numeric = v->is_number() || parse_number(v->string, b);
            std::string answer;
            if (!last_boxed(in.completion, answer)) answer = numeric ? last_number(in.completion) : trim(in.completion);
            bool same;
            if (v->is_number()) {
                same = parse_number(answer, a) && std::fabs(a - v->number) <= 1e-9 * std::max(1.0, std::fabs(v->number));
            } else if (parse_number(answer, a) && parse_number(v->string, b)) {
                same = std::fabs(a - b) <= 1e-9 * std::max(1.0, std::fabs(b));
            } else {
                same = !answer.empty() && trim(answer) == trim(v->string);
            }
            out.push_back(same ? 1.0 : 0.0);
        }
        return out;
    }

private:
    std::string field_, name_;
};

// POSIX extended regular expressions (regcomp): no recursion to overflow on a long completion, unlike std::regex.
class RegexMatch : public RewardFunction {
public:
    explicit RegexMatch(const std::string & pattern) : name_("regex:" + pattern) {
        if (const int rc = ::regcomp(&re_, pattern.c_str(), REG_EXTENDED | REG_NOSUB); rc != 0) {
            char buf[256];
            ::regerror(rc, &re_, buf, sizeof buf);
            throw Error(name_ + ": the pattern does not compile (" + buf + ")");
        }
    }
    ~RegexMatch() override { ::regfree(&re_); }
    RegexMatch(const RegexMatch &) = delete;
    RegexMatch & operator=(const RegexMatch &) = delete;
    const std::string & name() const override { return name_; }
    std::vector<double> score(const std::vector<RewardInput> & batch) override {
        std::vector<double> out;
        for (const RewardInput & in : batch) out.push_back(::regexec(&re_, in.completion.c_str(), 0, nullptr, 0) == 0 ? 1.0 : 0.0);
        return out;
    }

private:
    std::string name_;
    regex_t re_;
};

class StopsWithin : public RewardFunction {
public:
    explicit StopsWithin(int64_t n) : n_(n), name_("length:" + std::to_string(n)) {}
    const std::string & name() const override { return name_; }
    std::vector<double> score(const std::vector<RewardInput> & batch) override {
        std::vector<double> out;
        for (const RewardInput & in : batch) out.push_back(in.finished && in.tokens <= n_ ? 1.0 : 0.0);
        return out;
    }

private:
    int64_t n_;
    std::string name_;
};

// The user's program, started at the first batch and kept running (see rewards.h). Its stdin and stdout are
// sockets (socketpair), so that writing to a program that has gone raises no SIGPIPE (MSG_NOSIGNAL).
class RewardProgram : public RewardFunction {
public:
    RewardProgram(std::string command, double timeout_s) : command_(std::move(command)), name_("cmd:" + command_), timeout_s_(timeout_s) {
        if (trim(command_).empty()) throw Error("reward program: the command is empty");
        if (!(timeout_s_ > 0)) throw Error("reward program '" + command_ + "': the timeout must be > 0 seconds");
    }
    ~RewardProgram() override { stop(); }
    const std::string & name() const override { return name_; }

    std::vector<double> score(const std::vector<RewardInput> & batch) override {
        if (pid_ < 0) start();
        check_running();
        std::string out;
        for (const RewardInput & in : batch) out += line_for(in);
        std::vector<double> scores;
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
        size_t sent = 0;
        while (scores.size() < batch.size()) {
            pollfd fds[2] = {{out_fd_, POLLIN, 0}, {in_fd_, static_cast<short>(sent < out.size() ? POLLOUT : 0), 0}};
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
            if (left <= 0) fail_timeout(scores.size(), batch.size());
            const int r = ::poll(fds, 2, static_cast<int>(std::min<long long>(left, 1000)));
            if (r < 0 && errno != EINTR) fail("poll: " + std::string(std::strerror(errno)), scores.size(), batch.size());
            if (r <= 0) continue;
            if (fds[1].revents & (POLLOUT | POLLERR | POLLHUP)) {
                const ssize_t w = ::send(in_fd_, out.data() + sent, out.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (w > 0) sent += static_cast<size_t>(w);
                else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) sent = out.size();  // it closed its input: read on
            }
            if (fds[0].revents & (POLLIN | POLLERR | POLLHUP)) {
                char buf[4096];
                const ssize_t n = ::recv(out_fd_, buf, sizeof buf, MSG_DONTWAIT);
                if (n == 0) fail_exited(scores.size(), batch.size());
                if (n < 0) {
                    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
                    fail("reading its output: " + std::string(std::strerror(errno)), scores.size(), batch.size());
                }
                pending_.append(buf, static_cast<size_t>(n));
                size_t eol;
                while (scores.size() < batch.size() && (eol = pending_.find('\n')) != std::string::npos) {
                    const std::string line = pending_.substr(0, eol);
                    pending_.erase(0, eol + 1);
                    double v = 0;
                    if (!parse_number(line, v))
                        fail("its answer for completion " + std::to_string(scores.size() + 1) + " (" + batch[scores.size()].where + "), \"" +
                                 line.substr(0, 80) + "\", is not a finite number",
                             scores.size(), batch.size());
                    scores.push_back(v);
                }
            }
        }
        return scores;
    }

private:
    // {"prompt": P, "completion": C, ...the example's other fields}
    static std::string line_for(const RewardInput & in) {
        std::string s = "{\"prompt\": ";
        json::append_string(s, in.prompt);
        s += ", \"completion\": ";
        json::append_string(s, in.completion);
        if (in.example && in.example->is_object())
            for (const json::Member & m : in.example->object) {
                if (m.first == "prompt" || m.first == "completion") continue;
                s += ", ";
                json::append_string(s, m.first);
                s += ": ";
                s += json::dump(m.second);
            }
        return s + "}\n";
    }

    void start() {
        int to_child[2], from_child[2];
        if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, to_child) != 0)
            throw Error("reward program '" + command_ + "': socketpair: " + std::strerror(errno));
        if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, from_child) != 0) {
            const int e = errno;
            ::close(to_child[0]), ::close(to_child[1]);
            throw Error("reward program '" + command_ + "': socketpair: " + std::strerror(e));
        }
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, to_child[1], 0);  // (dup2 clears close-on-exec on 0 and 1)
        posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
        // Its own process group: stopping it stops what it started too (a hung `sleep` would keep its stderr,
        // our stderr, open).
        posix_spawnattr_t attr;
        posix_spawnattr_init(&attr);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
        posix_spawnattr_setpgroup(&attr, 0);
        const char * argv[] = {"sh", "-c", command_.c_str(), nullptr};
        pid_t pid = -1;
        const int rc = posix_spawn(&pid, "/bin/sh", &fa, &attr, const_cast<char * const *>(argv), environ);
        posix_spawnattr_destroy(&attr);
        posix_spawn_file_actions_destroy(&fa);
        ::close(to_child[1]);
        ::close(from_child[1]);
        if (rc != 0) {
            ::close(to_child[0]), ::close(from_child[0]);
            throw Error("reward program '" + command_ + "': cannot start /bin/sh: " + std::strerror(rc));
        }
        pid_ = group_ = pid;
        in_fd_ = to_child[0];
        out_fd_ = from_child[0];
    }

    // Between batches: a program that has exited is an error now, not at its next (unanswered) batch.
    void check_running() {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
            pid_ = -1;
            throw Error("reward program '" + command_ + "' " + describe_status(status) + " between batches");
        }
    }

    static std::string describe_status(int status) {
        if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
        if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
        return "stopped";
    }

    [[noreturn]] void fail(const std::string & what, size_t got, size_t want) {
        stop();
        throw Error("reward program '" + command_ + "': " + what + " (" + std::to_string(got) + " of " + std::to_string(want) +
                    " scores of the batch read)");
    }
    [[noreturn]] void fail_exited(size_t got, size_t want) {
        int status = 0;
        std::string how = "closed its output";
        for (int i = 0; i < 100; ++i) {  // it closed its output: give it a second to exit
            if (::waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                how = describe_status(status);
                break;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        fail(how + " before it scored every completion", got, want);
    }
    [[noreturn]] void fail_timeout(size_t got, size_t want) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%g", timeout_s_);
        fail(std::string("gave no answer within the timeout of ") + buf + " s and was killed", got, want);
    }

    // Closes its input (a program that reads to the end exits), then kills its process group if it has not exited
    // in a second; what it started is killed either way.
    void stop() {
        if (in_fd_ >= 0) ::close(in_fd_), in_fd_ = -1;
        if (out_fd_ >= 0) ::close(out_fd_), out_fd_ = -1;
        int status = 0;
        bool exited = pid_ < 0;
        for (int i = 0; i < 100 && !exited; ++i) {
            exited = ::waitpid(pid_, &status, WNOHANG) == pid_;
            if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        if (group_ > 0) ::kill(-group_, SIGKILL);  // (its group: the program, and what it left running)
        if (!exited) ::waitpid(pid_, &status, 0);
        pid_ = group_ = -1;
    }

    std::string command_, name_;
    double timeout_s_;
    pid_t pid_ = -1;    // the program (-1 once reaped)
    pid_t group_ = -1;  // its process group (killed when it stops)
    int in_fd_ = -1, out_fd_ = -1;
    std::string pending_;  // output read but not yet a whole line
};

} // namespace

std::string extract_answer(const std::string & text) {
    std::string answer;
    return last_boxed(text, answer) ? answer : last_number(text);
}

std::unique_ptr<RewardFunction> make_builtin_reward(const std::string & spec) {
    const size_t colon = spec.find(':');
    const std::string kind = spec.substr(0, colon), arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
    if (colon != std::string::npos && kind == "exact") {
        if (arg.empty()) throw Error("reward \"" + spec + "\": exact needs the field to compare with (exact:FIELD)");
        return std::make_unique<ExactAnswer>(arg);
    }
    if (colon != std::string::npos && kind == "regex") {
        if (arg.empty()) throw Error("reward \"" + spec + "\": regex needs a pattern (regex:PATTERN)");
        return std::make_unique<RegexMatch>(arg);
    }
    if (colon != std::string::npos && kind == "length") {
        double n = 0;
        if (!parse_number(arg, n) || n < 1 || n != std::floor(n) || n > 1e9)
            throw Error("reward \"" + spec + "\": length needs a whole number of tokens >= 1 (length:N)");
        return std::make_unique<StopsWithin>(static_cast<int64_t>(n));
    }
    throw Error("reward \"" + spec + "\" is not one of exact:FIELD, regex:PATTERN, length:N");
}

std::unique_ptr<RewardFunction> make_reward_program(const std::string & command, double timeout_s) {
    return std::make_unique<RewardProgram>(command, timeout_s);
}

void RewardSet::add(std::unique_ptr<RewardFunction> f, double weight) {
    if (!std::isfinite(weight)) throw Error("reward " + f->name() + ": its weight must be a finite number");
    fns_.push_back(std::move(f));
    weights_.push_back(weight);
}

std::vector<double> RewardSet::score(const std::vector<RewardInput> & batch, std::vector<std::vector<double>> * scores) {
    std::vector<double> total(batch.size(), 0.0);
    if (scores) scores->clear();
    for (size_t i = 0; i < fns_.size(); ++i) {
        std::vector<double> s = fns_[i]->score(batch);
        if (s.size() != batch.size())
            throw Error("reward " + fns_[i]->name() + ": " + std::to_string(s.size()) + " scores for " + std::to_string(batch.size()) + " completions");
        for (size_t k = 0; k < s.size(); ++k) total[k] += weights_[i] * s[k];
        if (scores) scores->push_back(std::move(s));
    }
    return total;
}

} // namespace rp
