// Hugging Face's JavaScript tokenizers (npm @huggingface/tokenizers, fetched by scripts/fetch-oracle.sh) on the
// tokenizer files we export: the peer test_hf_tokenizer.cpp compares our tokenizer with.
// usage: node hf_tokenize.mjs TOKENIZERS_MJS DIR CASES.json
//   DIR: tokenizer.json and tokenizer_config.json; CASES.json: an array of strings.
// Prints one JSON array: per case {"plain": ids without special tokens added, "special": ids with them,
// "decoded": the text of "plain" decoded with the special tokens kept}.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [lib, dir, casesPath] = process.argv.slice(2);
const { Tokenizer } = await import(pathToFileURL(lib).href);
const read = (p) => JSON.parse(readFileSync(p, "utf8"));
const tok = new Tokenizer(read(`${dir}/tokenizer.json`), read(`${dir}/tokenizer_config.json`));
const out = read(casesPath).map((text) => {
  const plain = tok.encode(text, { add_special_tokens: false }).ids;
  const special = tok.encode(text).ids;
  // (tokenizers.js refuses to decode no ids)
  return { plain, special, decoded: plain.length ? tok.decode(plain, { skip_special_tokens: false }) : "" };
});
process.stdout.write(JSON.stringify(out));
