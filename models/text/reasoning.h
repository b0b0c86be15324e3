// The reasoning of a "thinking" model's reply, told apart from its answer as the reply streams out (what chat
// front-ends show collapsed or dimmed). Qwen3, QwQ and DeepSeek-R1 write it between <think> and </think>;
// their templates may already open the block in the generation prompt (DeepSeek-R1: "...<｜Assistant｜><think>\n"),
// so whether the reply starts inside it is read off the rendered prompt.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rp {

struct ThinkingMarkers {
    std::string open, close;
};

// The markers a chat template's model writes its reasoning between (from the template's source), or nullopt
// for a template without a reasoning block.
std::optional<ThinkingMarkers> thinking_markers(std::string_view template_source);

// True when `prompt` (a rendering with the generation prompt) ends inside an open reasoning block: its last
// open marker comes after its last close marker.
bool prompt_opens_thinking(std::string_view prompt, const ThinkingMarkers & m);

// Splits streamed text into reasoning and answer pieces, the markers themselves removed (and the newlines
// right after each marker). A marker may arrive split over several feeds: text that could
// be the start of one is held back until it is decided.
class ReasoningSplitter {
public:
    struct Piece {
        bool reasoning = false;
        std::string text;
    };
    ReasoningSplitter(ThinkingMarkers markers, bool starts_in_reasoning);

    std::vector<Piece> feed(std::string_view text);
    std::vector<Piece> finish();  // what was held back (the reply ended)

    bool in_reasoning() const { return in_; }
    size_t reasoning_bytes() const { return reasoning_bytes_; }

private:
    void emit(std::vector<Piece> & out, std::string_view text);

    ThinkingMarkers m_;
    bool in_ = false;
    bool after_marker_ = false;  // just passed a marker: the newlines that follow it are dropped
    std::string held_;
    size_t reasoning_bytes_ = 0;
};

} // namespace rp
