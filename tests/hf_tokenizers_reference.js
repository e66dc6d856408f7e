// The reference side of the Hugging Face tokenizer parity test: the npm package
// @huggingface/tokenizers (tokenizers.js, Hugging Face's JavaScript implementation of the
// tokenizer.json format) encodes and decodes every string of a JSON array.
// Usage: node tests/hf_tokenizers_reference.js NODE_MODULES_DIR TOKENIZER.json CONFIG.json STRINGS.json OUT.json
// OUT.json <- [{"ids": [...], "decoded": "..."}, ...]: ids with the special tokens
// (add_special_tokens, the library's default), decoded with skip_special_tokens and without
// transformers' clean_up_tokenization_spaces (qkv applies that only when the config asks).
'use strict';
const fs = require('fs');
const path = require('path');

const [modules, tokenizerFile, configFile, stringsFile, outFile] = process.argv.slice(2);
if (!outFile) {
  console.error('usage: node hf_tokenizers_reference.js NODE_MODULES_DIR TOKENIZER.json CONFIG.json STRINGS.json OUT.json');
  process.exit(2);
}
// the CommonJS build by its path: a directory path would take package.json's "main" (the ES
// module), which Debian 12's Node.js 18 cannot require()
const { Tokenizer } = require(path.resolve(modules, '@huggingface/tokenizers/dist/tokenizers.cjs'));
const tokenizerJson = JSON.parse(fs.readFileSync(tokenizerFile, 'utf8'));
const config = JSON.parse(fs.readFileSync(configFile, 'utf8'));
const tok = new Tokenizer(tokenizerJson, config);
const strings = JSON.parse(fs.readFileSync(stringsFile, 'utf8'));
const out = strings.map((s) => {
  const ids = tok.encode(s).ids;
  // decode() refuses an empty list
  const decoded = ids.length === 0 ? '' : tok.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false });
  return { ids, decoded };
});
fs.writeFileSync(outFile, JSON.stringify(out) + '\n');
console.log(`@huggingface/tokenizers: ${strings.length} strings with ${tokenizerFile}`);
