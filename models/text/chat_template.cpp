#include "models/text/chat_template.h"

#include <cctype>

#include "base/error.h"
#include "gguf/gguf.h"
#include "models/text/jinja/jinja.h"
#include "models/text/tokenizer.h"

#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>

namespace rp {

namespace {

// The fixed formats of earlier versions, as Jinja: ChatML, and Llama 3 with trimmed contents and no
// <|begin_of_text|> (the tokenizer adds BOS).
const char * const kChatML =
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";
const char * const kLlama3 =
    "{%- for message in messages -%}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}";

const char * const kProbe = "rp_probe_reply_5f1c";

// Harmony's (gpt-oss's) markers: a final answer's header, and the two ends of a message.
const char * const kHarmonyFinal = "<|channel|>final<|message|>";
const char * const kHarmonyEnd = "<|end|>";
const char * const kHarmonyReturn = "<|return|>";

std::tm date_of(const std::string & date) {
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    if (date.empty()) return tm;
    int y = 0, m = 0, d = 0;
    char tail = 0;
    if (std::sscanf(date.c_str(), "%4d-%2d-%2d%c", &y, &m, &d, &tail) != 3 || y < 1900 || m < 1 || m > 12 || d < 1 || d > 31)
        throw Error("date '" + date + "' is not YYYY-MM-DD");
    std::tm out{};
    out.tm_year = y - 1900;
    out.tm_mon = m - 1;
    out.tm_mday = d;
    out.tm_hour = 12;
    out.tm_isdst = -1;
    std::mktime(&out);  // fills in the weekday and day of the year
    if (out.tm_mday != d || out.tm_mon != m - 1) throw Error("date '" + date + "' does not exist");
    return out;
}

std::string strftime_str(const std::tm & tm, const char * fmt) {
    char buf[64];
    const size_t n = std::strftime(buf, sizeof buf, fmt, &tm);
    return std::string(buf, n);
}

std::string read_text_file(const std::string & path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(path + ": cannot open the chat template file");
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

bool file_exists(const std::string & path) {
    std::ifstream f(path);
    return static_cast<bool>(f);
}

// Whether a template has a system role, probed as llama.cpp's capability check does: a system and a user
// message rendered with a generation prompt. llama.cpp asks whether the system content was read; we ask
// whether it was written out: the same answer where a template raises on a system message (Gemma 2) or
// writes it (every other template ChatOracle renders).
bool takes_system_message(const jinja::Template & t) {
    using jinja::Value;
    const char * const probe = "rp_probe_system_3a7e";
    Value vars = Value::object();
    Value msgs = Value::array();
    for (const auto & [role, content] : {std::pair<const char *, const char *>{"system", probe}, {"user", "User message"}}) {
        Value o = Value::object();
        o.obj().set("content", Value::string(content));
        o.obj().set("role", Value::string(role));
        msgs.arr().push_back(o);
    }
    vars.obj().set("messages", msgs);
    vars.obj().set("bos_token", Value::string(""));
    vars.obj().set("eos_token", Value::string(""));
    vars.obj().set("add_generation_prompt", Value::boolean(true));
    try {
        return t.render(vars, date_of("")).find(probe) != std::string::npos;
    } catch (const Error &) {
        return false;
    }
}

} // namespace

ChatTemplate::ChatTemplate(const std::string & source, std::string name)
    : name_(std::move(name)), source_(source), harmony_(source.find("<|channel|>") != std::string::npos),
      // llama.cpp's test for Ministral / Magistral 3 (Mistral Small 3.2 has [CALL_ID] too)
      blocks_(source.find("[SYSTEM_PROMPT]") != std::string::npos && source.find("[TOOL_CALLS]") != std::string::npos &&
              source.find("[ARGS]") != std::string::npos && source.find("[CALL_ID]") == std::string::npos),
      // llama.cpp's test for StepFun-3.5's template, whose contents it trims (its "leftover whitespace" workaround)
      trim_contents_(source.find("You have access to the following functions in JSONSchema format") != std::string::npos) {
    try {
        tmpl_ = std::make_shared<const jinja::Template>(source);
    } catch (const Error & e) {
        throw Error("chat template " + name_ + ": " + e.what());
    }
    system_role_ = takes_system_message(*tmpl_);
}

void ChatTemplate::set_special_tokens(std::string bos, std::string eos, bool strip_bos, bool strip_eos) {
    bos_ = std::move(bos);
    eos_ = std::move(eos);
    strip_bos_ = strip_bos;
    strip_eos_ = strip_eos;
}

std::string ChatTemplate::apply(const std::vector<ChatMessage> & messages, const ChatOptions & opt) const {
    using jinja::Value;
    Value vars = Value::object();
    jinja::Object & g = vars.obj();
    Value msgs = Value::array();
    const bool fold = !system_role_ && !messages.empty() && messages.front().role == "system";
    std::vector<ChatMessage> folded;
    if (fold) {
        folded.assign(messages.begin() + 1, messages.end());
        if (!folded.empty()) folded.front().content = messages.front().content + "\n" + folded.front().content;
    }
    std::vector<ChatMessage> trimmed;
    if (trim_contents_) {
        auto trim = [](const std::string & s) {  // C isspace at both ends, as llama.cpp's trim_whitespace
            size_t b = 0, e = s.size();
            while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
            while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
            return s.substr(b, e - b);
        };
        trimmed = fold ? folded : messages;
        for (ChatMessage & m : trimmed) m.content = trim(m.content), m.reasoning_content = trim(m.reasoning_content);
    }
    for (const ChatMessage & m : trim_contents_ ? trimmed : fold ? folded : messages) {
        // llama.cpp passes each message as nlohmann JSON, whose keys come out sorted.
        Value o = Value::object();
        if (blocks_ && (m.role == "system" || m.role == "assistant")) {
            // Ministral 3: llama.cpp hands system and assistant contents over as blocks, reasoning as a thinking block.
            Value content = Value::array();
            auto block = [&](const char * key, const std::string & text, const char * type) {
                Value b = Value::object();
                b.obj().set(key, Value::string(text));
                b.obj().set("type", Value::string(type));
                content.arr().push_back(b);
            };
            if (!m.reasoning_content.empty()) block("thinking", m.reasoning_content, "thinking");
            block("text", m.content, "text");
            o.obj().set("content", content);
            o.obj().set("role", Value::string(m.role));
            msgs.arr().push_back(o);
            continue;
        }
        o.obj().set("content", Value::string(m.content));
        if (!m.reasoning_content.empty()) o.obj().set("reasoning_content", Value::string(m.reasoning_content));
        o.obj().set("role", Value::string(m.role));
        if (harmony_ && !m.reasoning_content.empty()) o.obj().set("thinking", Value::string(m.reasoning_content));
        msgs.arr().push_back(o);
    }
    const std::tm now = date_of(opt.date);
    g.set("messages", msgs);
    g.set("bos_token", Value::string(bos_));
    g.set("eos_token", Value::string(eos_));
    g.set("enable_thinking", Value::boolean(opt.enable_thinking));
    g.set("datetime", Value::string(strftime_str(now, "%b %d %Y")));
    g.set("date_string", Value::string(strftime_str(now, "%d %b %Y")));
    if (opt.add_generation_prompt) g.set("add_generation_prompt", Value::boolean(true));
    std::string out;
    try {
        out = tmpl_->render(vars, now);
    } catch (const Error & e) {
        throw Error("chat template " + name_ + ": " + e.what());
    }
    if (harmony_ && opt.inference && !opt.add_generation_prompt)
        if (const size_t at = out.rfind(kHarmonyReturn); at != std::string::npos)
            out.replace(at, std::string_view(kHarmonyReturn).size(), kHarmonyEnd);
    if (strip_bos_ && !bos_.empty() && out.compare(0, bos_.size(), bos_) == 0) out.erase(0, bos_.size());
    if (strip_eos_ && !eos_.empty() && out.size() >= eos_.size() &&
        out.compare(out.size() - eos_.size(), eos_.size(), eos_) == 0)
        out.erase(out.size() - eos_.size());
    return out;
}

std::string ChatTemplate::end_of_turn(const ChatOptions & opt) const {
    ChatOptions o = opt;
    o.add_generation_prompt = false;
    const std::string r = apply({{"user", "u"}, {"assistant", kProbe}}, o);
    const size_t at = r.rfind(kProbe);
    if (at == std::string::npos) throw Error("chat template " + name_ + ": it does not render an assistant reply's content");
    size_t e = at + std::string_view(kProbe).size();
    const size_t b = e;
    while (e < r.size() && r[e] != ' ' && r[e] != '\n' && r[e] != '\t' && r[e] != '\r') ++e;
    if (e == b) throw Error("chat template " + name_ + ": no end-of-turn marker after an assistant reply");
    return r.substr(b, e - b);
}

std::string ChatTemplate::turn_terminator(const ChatOptions & opt) const {
    ChatOptions o = opt;
    o.add_generation_prompt = false;
    const std::string two = apply({{"user", "rp_probe_u1"}, {"assistant", kProbe}, {"user", "rp_probe_u2"}}, o);
    const std::string lone = apply({{"user", "rp_probe_u2"}}, o);
    const size_t a = two.find(kProbe), b = two.find("rp_probe_u2"), l = lone.find("rp_probe_u2");
    if (a == std::string::npos || b == std::string::npos || b < a || l == std::string::npos)
        throw Error("chat template " + name_ + ": it does not render a reply and the user turn after it");
    const std::string between = two.substr(a + std::string_view(kProbe).size(), b - a - std::string_view(kProbe).size());
    // The next turn's opening: the longest end of `between` that also ends the text before a lone user's content.
    size_t k = 0;
    while (k < between.size() && k < l && between[between.size() - 1 - k] == lone[l - 1 - k]) ++k;
    return between.substr(0, between.size() - k);
}

std::string ChatTemplate::shared_terminator(const ChatOptions & opt) const {
    ChatOptions o = opt, g = opt;
    o.add_generation_prompt = false;
    g.add_generation_prompt = true;
    const std::string two = apply({{"user", "rp_probe_u1"}, {"assistant", kProbe}, {"user", "rp_probe_u2"}}, o);
    const std::string one = apply({{"user", "rp_probe_u1"}, {"assistant", kProbe}}, o);
    const std::string user = apply({{"user", "rp_probe_u1"}}, o), prompt = apply({{"user", "rp_probe_u1"}}, g);
    const size_t a = two.find(kProbe), b = one.find(kProbe);
    if (a == std::string::npos || b == std::string::npos) throw Error("chat template " + name_ + ": it does not render an assistant reply's content");
    const std::string mid = two.substr(a + std::string_view(kProbe).size()), last = one.substr(b + std::string_view(kProbe).size());
    size_t k = 0;
    while (k < mid.size() && k < last.size() && mid[k] == last[k]) ++k;
    if (k < mid.size() && k < last.size())  // they part inside a marker: keep whole markers
        while (k > 0 && mid[k - 1] != '>' && mid[k - 1] != '\n') --k;
    std::string t = mid.substr(0, k);
    const std::string open = prompt.compare(0, user.size(), user) == 0 ? prompt.substr(user.size()) : std::string();
    for (size_t n = std::min(t.size(), open.size()); n > 0; --n)
        if (t.compare(t.size() - n, n, open, 0, n) == 0) {
            t.erase(t.size() - n);
            break;
        }
    return t;
}

namespace {

// The reply as a template may write it: as given, trimmed at either end, or (Qwen3-style templates) the part after
// its last </think> without the newlines after that.
std::vector<std::string> rendered_forms(const std::string & content) {
    std::vector<std::string> forms = {content};
    auto strip = [](std::string s, bool front, bool back) {
        const char * ws = " \t\n\r\v\f";
        if (back) s.erase(s.find_last_not_of(ws) + 1);
        if (front) s.erase(0, std::min(s.size(), s.find_first_not_of(ws)));
        return s;
    };
    for (const auto & [front, back] : {std::pair<bool, bool>{true, true}, {false, true}, {true, false}}) forms.push_back(strip(content, front, back));
    if (const size_t t = content.rfind("</think>"); t != std::string::npos) {
        std::string after = content.substr(t + 8);
        forms.push_back(after);
        forms.push_back(strip(after, true, false));
        forms.push_back(strip(after, true, true));
    }
    return forms;
}

// Spans by substitution, for templates whose rendering of the first messages is not a prefix of the whole
// (Mistral's put the system message into the last user turn) and those without a marker right after a reply:
// every assistant content replaced by a marker of its own and rendered; the rendering's fixed text between the
// markers must then be found in the real rendering around each reply as the template writes it (rendered_forms:
// a template may trim a reply) for the spans to be that reply, up to the end-of-turn marker after it (optional:
// only where the rendering has it). Empty when the real rendering does not come apart that way.
std::vector<AssistantSpan> substituted_spans(const ChatTemplate & t, const std::vector<ChatMessage> & messages, const ChatOptions & opt,
                                             const std::string & text, const std::string & eot, bool eot_optional, bool mark_empty,
                                             bool keep_thinking) {
    // Without mark_empty an empty reply is left as it is (GLM writes "<think></think>" without the newline it puts
    // before a reply): its span, empty but for a marker after it, starts where the text stops following the
    // generation prompt.
    // With keep_thinking a reply's "...</think>" part stays in front of its marker (a template that moves it into a
    // reasoning block of its own: GLM's), and the span is the answer after it.
    std::vector<ChatMessage> marked = messages;
    std::vector<std::string> markers(messages.size()), answers(messages.size());
    for (size_t i = 0; i < marked.size(); ++i) {
        if (marked[i].role != "assistant" || (!mark_empty && marked[i].content.empty())) continue;
        markers[i] = "\x1frp-reply-" + std::to_string(i) + "\x1f";
        const size_t think = keep_thinking ? marked[i].content.rfind("</think>") : std::string::npos;
        answers[i] = think == std::string::npos ? marked[i].content : marked[i].content.substr(think + 8);
        marked[i].content = (think == std::string::npos ? std::string() : marked[i].content.substr(0, think + 8)) + markers[i];
    }
    const std::string skeleton = t.apply(marked, opt);
    std::vector<AssistantSpan> spans;
    size_t sk = 0, pos = 0;  // positions in the skeleton and the real text that correspond
    for (size_t i = 0; i < messages.size(); ++i) {
        if (messages[i].role == "assistant" && markers[i].empty()) {
            ChatOptions gen = opt;
            gen.add_generation_prompt = true;
            const std::string prompt = t.apply(std::vector<ChatMessage>(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i)), gen);
            size_t b = 0;
            while (b < prompt.size() && b < text.size() && prompt[b] == text[b]) ++b;
            if (b < pos) return {};
            AssistantSpan s;
            s.begin = s.content_end = b;
            s.end = b + (!eot.empty() && text.compare(b, eot.size(), eot) == 0 ? eot.size() : 0);
            if (s.end == b && !eot.empty() && !eot_optional) return {};
            spans.push_back(s);
            continue;
        }
        if (markers[i].empty()) continue;
        const size_t at = skeleton.find(markers[i], sk);
        if (at == std::string::npos || skeleton.find(markers[i], at + 1) != std::string::npos) return {};
        // The fixed text before this reply, and the one after it up to the next marker (or the end).
        const std::string_view fixed(skeleton.data() + sk, at - sk);
        if (text.compare(pos, fixed.size(), fixed) != 0) return {};
        pos += fixed.size();
        const size_t next = skeleton.find('\x1f', at + markers[i].size());
        const std::string_view after(skeleton.data() + at + markers[i].size(), (next == std::string::npos ? skeleton.size() : next) - at - markers[i].size());
        bool found = false;
        for (const std::string & form : rendered_forms(answers[i])) {
            if (text.compare(pos, form.size(), form) != 0 || text.compare(pos + form.size(), after.size(), after) != 0) continue;
            AssistantSpan s;
            s.begin = pos;
            s.content_end = pos + form.size();
            const bool has_eot = !eot.empty() && text.compare(s.content_end, eot.size(), eot) == 0;
            if (!has_eot && !eot.empty() && !eot_optional) return {};
            s.end = s.content_end + (has_eot ? eot.size() : 0);
            spans.push_back(s);
            pos = s.content_end;
            found = true;
            break;
        }
        if (!found) return {};
        sk = at + markers[i].size();
    }
    if (text.compare(pos, std::string::npos, skeleton, sk, std::string::npos) != 0) return {};
    for (size_t k = 1; k < spans.size(); ++k)
        if (spans[k].begin < spans[k - 1].end) return {};
    return spans;
}

std::vector<AssistantSpan> spans_by_substitution(const ChatTemplate & t, const std::vector<ChatMessage> & messages, const ChatOptions & opt,
                                                 const std::string & text, const std::string & eot, bool eot_optional) {
    for (const bool keep_thinking : {false, true})
        for (const bool mark_empty : {true, false})
            if (std::vector<AssistantSpan> s = substituted_spans(t, messages, opt, text, eot, eot_optional, mark_empty, keep_thinking); !s.empty())
                return s;
    return {};
}

} // namespace

RenderedChat ChatTemplate::render(const std::vector<ChatMessage> & messages, const ChatOptions & opt) const {
    RenderedChat r;
    r.text = apply(messages, opt);
    std::string eot;
    ChatOptions prefix_opt = opt, no_prompt = opt;
    prefix_opt.add_generation_prompt = true;
    no_prompt.add_generation_prompt = false;
    size_t floor = 0;  // spans are ordered and do not overlap
    bool any = false;
    for (const ChatMessage & m : messages) any = any || m.role == "assistant";
    if (any && !harmony_) {
        // A template that writes no marker right after a reply: spans by substitution with its turn terminator.
        bool marked = true;
        try {
            eot = end_of_turn(opt);
        } catch (const Error &) {
            marked = false;
        }
        if (!marked) {
            eot = turn_terminator(opt);  // the spans are where the replies were substituted: a reply may contain it
            r.assistant = spans_by_substitution(*this, messages, opt, r.text, eot, true);
            if (r.assistant.empty())
                throw Error("chat template " + name_ + ": the assistant replies cannot be found in the rendering (the template "
                            "rewrites them, and writes no end-of-turn marker right after a reply)");
            return r;
        }
    }
    // Where the turns do not come one after the other, spans by substitution: with the marker, then with the end a
    // reply has wherever it stands (Cohere's last reply gets the next turn's opening too).
    auto by_substitution = [&]() {
        if (harmony_) return false;
        for (size_t k = 0; k < messages.size(); ++k)
            if (messages[k].role == "assistant" && messages[k].content.find(eot) != std::string::npos)
                throw Error("chat template " + name_ + ": messages[" + std::to_string(k) +
                            "] (assistant): the content contains the end-of-turn marker " + eot);
        r.assistant = spans_by_substitution(*this, messages, opt, r.text, eot, false);
        if (r.assistant.empty())
            if (const std::string shared = shared_terminator(opt); !shared.empty() && shared != eot)
                r.assistant = spans_by_substitution(*this, messages, opt, r.text, shared, false);
        return !r.assistant.empty();
    };
    for (size_t i = 0; i < messages.size(); ++i) {
        if (messages[i].role != "assistant") continue;
        const std::string where = "chat template " + name_ + ": messages[" + std::to_string(i) + "] (assistant): ";
        const std::vector<ChatMessage> before(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i));
        const std::string base = apply(before, no_prompt);
        const std::string prompt = apply(before, prefix_opt);
        if (base.size() < floor || r.text.compare(0, base.size(), base) != 0 || prompt.compare(0, base.size(), base) != 0) {
            if (by_substitution()) return r;
            throw Error(where + "the rendering of the messages before it is not a prefix of the whole rendering, so "
                        "its span cannot be found");
        }
        // The span starts after as much of the generation prompt as the turn really has: templates open
        // the prompt with a think block (<think>\n, an empty one when thinking is off) that an earlier
        // reply does not get.
        // Cut only after a newline or a '>' (the end of a marker) or at the prompt's end, so that a reply
        // that happens to start like the think opener ("<" of "<|im_end|>") is not cut into.
        size_t begin = base.size();
        for (size_t k = base.size(); k < prompt.size() && k < r.text.size() && prompt[k] == r.text[k]; ++k)
            if (prompt[k] == '\n' || prompt[k] == '>' || k + 1 == prompt.size()) begin = k + 1;
        if (harmony_) {
            const AssistantSpan s = harmony_span(r.text, begin, messages[i], where, opt);
            floor = s.end;
            r.assistant.push_back(s);
            continue;
        }
        if (messages[i].content.find(eot) != std::string::npos)
            throw Error(where + "the content contains the end-of-turn marker " + eot);
        // The marker must close this reply: it starts no later than the rendering up to and including the reply ends
        // (firefunction's probe reply is followed by the assistant header it always appends, which the replies in
        // the middle are not).
        const size_t upto = apply(std::vector<ChatMessage>(messages.begin(), messages.begin() + static_cast<std::ptrdiff_t>(i) + 1), no_prompt).size();
        const size_t m = r.text.find(eot, begin);
        if (messages[i].content.empty() && (m == std::string::npos || m > upto)) {
            // An empty reply the template leaves out (ByteDance-Seed-OSS's): an empty span where it would start.
            r.assistant.push_back({begin, begin, begin});
            floor = begin;
            continue;
        }
        if (m == std::string::npos || m > upto) {
            if (by_substitution()) return r;
            throw Error(where + "no end-of-turn marker " + eot + " after the reply");
        }
        AssistantSpan s;
        s.begin = begin;
        s.content_end = m;
        s.end = m + eot.size();
        floor = s.end;
        r.assistant.push_back(s);
    }
    return r;
}

ChatTemplate chat_template_from_name(std::string_view name) {
    if (name == "chatml" || name == "qwen" || name == "qwen2" || name == "qwen3") return ChatTemplate(kChatML, "chatml");
    if (name == "llama3" || name == "llama-3") return ChatTemplate(kLlama3, "llama3");
    const std::string path(name);
    const bool jinja_file = path.size() > 6 && path.compare(path.size() - 6, 6, ".jinja") == 0;
    if (jinja_file || file_exists(path)) return ChatTemplate(read_text_file(path), path);
    throw Error("unknown chat template '" + path + "' (known: chatml, llama3, or a FILE.jinja)");
}

ChatTemplate chat_template_for(const gguf::Reader & reader, std::string_view name) {
    if (!name.empty()) return chat_template_from_name(name);
    if (!reader.find("tokenizer.chat_template"))
        throw Error(reader.path() + ": no tokenizer.chat_template; name a chat template (chatml, llama3, FILE.jinja)");
    return ChatTemplate(reader.get_string("tokenizer.chat_template"), reader.path() + ": tokenizer.chat_template");
}

ChatTemplate chat_template_for(const Tokenizer & tok, std::string_view name) {
    if (name.empty() && tok.chat_template().empty())
        throw Error("the model has no tokenizer.chat_template; name a chat template (chatml, llama3, FILE.jinja)");
    ChatTemplate t = name.empty() ? ChatTemplate(tok.chat_template(), "tokenizer.chat_template")
                                  : chat_template_from_name(name);
    // As llama.cpp: the token texts with special tokens spelled out; no token, no text.
    const std::string bos = tok.bos() >= 0 ? tok.token_to_piece(tok.bos(), true) : std::string();
    const std::string eos = tok.eos() >= 0 ? tok.token_to_piece(tok.eos(), true) : std::string();
    t.set_special_tokens(bos, eos, tok.add_bos(), tok.add_eos());
    return t;
}

AssistantSpan ChatTemplate::harmony_span(const std::string & text, size_t begin, const ChatMessage & m, const std::string & where,
                                         const ChatOptions & opt) const {
    for (const char * marker : {kHarmonyEnd, kHarmonyReturn, kHarmonyFinal})
        if (m.content.find(marker) != std::string::npos || m.reasoning_content.find(marker) != std::string::npos)
            throw Error(where + "the message contains the harmony marker " + marker);
    const size_t final_at = text.find(kHarmonyFinal, begin);
    if (final_at == std::string::npos) throw Error(where + "no final answer (" + kHarmonyFinal + ") after the generation prompt");
    const size_t end_at = text.find(kHarmonyEnd, final_at), return_at = text.find(kHarmonyReturn, final_at);
    const size_t m_at = std::min(end_at, return_at);
    if (m_at == std::string::npos) throw Error(where + "the final answer has no " + kHarmonyEnd + " or " + kHarmonyReturn);
    AssistantSpan s;
    s.begin = opt.train_analysis ? begin : final_at;
    s.content_end = m_at;
    s.end = m_at + std::string_view(m_at == end_at ? kHarmonyEnd : kHarmonyReturn).size();
    return s;
}

RenderedChat render_chat(const ChatTemplate & t, const std::vector<ChatMessage> & messages, bool add_generation_prompt) {
    ChatOptions o;
    o.add_generation_prompt = add_generation_prompt;
    return t.render(messages, o);
}

RenderedChat render_training_chat(const ChatTemplate & t, const std::vector<ChatMessage> & messages, bool train_analysis) {
    ChatOptions o;
    o.inference = false;
    o.train_analysis = train_analysis;
    return t.render(messages, o);
}

} // namespace rp
