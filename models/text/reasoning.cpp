#include "models/text/reasoning.h"

#include <algorithm>
#include <utility>

namespace rp {

std::optional<ThinkingMarkers> thinking_markers(std::string_view src) {
    if (src.find("<think>") != std::string_view::npos || src.find("</think>") != std::string_view::npos)
        return ThinkingMarkers{"<think>", "</think>"};
    return std::nullopt;
}

bool prompt_opens_thinking(std::string_view prompt, const ThinkingMarkers & m) {
    const size_t o = prompt.rfind(m.open);
    if (o == std::string_view::npos) return false;
    const size_t c = prompt.rfind(m.close);
    return c == std::string_view::npos || c < o;
}

ReasoningSplitter::ReasoningSplitter(ThinkingMarkers markers, bool starts_in_reasoning)
    : m_(std::move(markers)), in_(starts_in_reasoning), after_marker_(starts_in_reasoning) {}

void ReasoningSplitter::emit(std::vector<Piece> & out, std::string_view text) {
    if (after_marker_) {  // "<think>\n", "</think>\n\n": the newlines belong to the markers
        const size_t k = text.find_first_not_of("\r\n");
        if (k == std::string_view::npos) return;
        text.remove_prefix(k);
        after_marker_ = false;
    }
    if (text.empty()) return;
    if (in_) reasoning_bytes_ += text.size();
    if (!out.empty() && out.back().reasoning == in_) out.back().text += text;
    else out.push_back({in_, std::string(text)});
}

std::vector<ReasoningSplitter::Piece> ReasoningSplitter::feed(std::string_view text) {
    std::vector<Piece> out;
    held_ += text;
    for (;;) {
        const std::string & marker = in_ ? m_.close : m_.open;
        const size_t at = held_.find(marker);
        if (at != std::string::npos) {
            emit(out, std::string_view(held_).substr(0, at));
            held_.erase(0, at + marker.size());
            after_marker_ = true;
            in_ = !in_;
            continue;
        }
        // No whole marker: keep the longest tail that is a prefix of it (it may complete with the next feed).
        size_t keep = std::min(held_.size(), marker.size() - 1);
        while (keep > 0 && held_.compare(held_.size() - keep, keep, marker, 0, keep) != 0) --keep;
        emit(out, std::string_view(held_).substr(0, held_.size() - keep));
        held_.erase(0, held_.size() - keep);
        return out;
    }
}

std::vector<ReasoningSplitter::Piece> ReasoningSplitter::finish() {
    std::vector<Piece> out;
    emit(out, held_);
    held_.clear();
    return out;
}

} // namespace rp
