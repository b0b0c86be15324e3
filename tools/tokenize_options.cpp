#include "tools/tokenize_options.h"

#include "base/error.h"

namespace rp::cli {

void declare_tokenize_options(Options & p, TokenizeSettings & s) {
    p.text("-m,--model", s.model_path, "GGUF file whose tokenizer to use (a vocab-only file is fine)");
    p.group("Tokens");
    p.text("-p,--prompt", s.prompt, "text to tokenize");
    p.text("-f,--file", s.text_file, "read the text from FILE (bytes as they are)");
    p.flag("--no-bos", s.no_bos, "do not add BOS / EOS tokens");
    p.flag("--parse-special", s.parse_special, "match special-token texts (<|im_start|>, <s>, ...)");
    p.flag("--ids", s.ids_only, "print only the ids, on one line");
    p.group("Chat rendering");
    p.text("--render-chat", s.chats,
           "render each conversation of F (one {\"messages\": [...]} per line) with the\n"
           "model's chat template; each rendering is followed by a line holding only\n"
           "the byte 0x1D (a BOS the tokenizer adds itself is left out); a conversation\n"
           "that fails is named on stderr, its record left empty, the others rendered",
           "F");
    p.text("--chat-template", s.chat_template, "the template: a FILE.jinja, or chatml / llama3 (default: the model's)", "T");
    p.flag("--no-generation-prompt", s.no_generation_prompt, "do not end with the assistant's header (default: add it)");
    p.flag("--no-thinking", s.no_thinking, "enable_thinking = false (Qwen3, QwQ, DeepSeek-R1)");
    p.text("--date", s.date, "the date templates print (YYYY-MM-DD; default: today)", "D");
    p.flag("--mask", s.mask, "mark each assistant span (the trained bytes) as \xe2\x9f\xaa...\xe2\x9f\xab (U+27EA, U+27EB)");
}

void TokenizeSettings::validate() const {
    if (model_path.empty()) throw Error("no model given (-m MODEL.gguf)");
    if (!chats.empty()) {
        if (prompt || !text_file.empty()) throw Error("--render-chat takes no -p / -f");
    } else if (prompt.has_value() == !text_file.empty()) {
        throw Error("give exactly one of -p TEXT and -f FILE");
    }
}

} // namespace rp::cli
