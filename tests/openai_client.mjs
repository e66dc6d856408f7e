// qkv serve through OpenAI's official Node client (npm `openai`), as applications call it:
//   node tests/openai_client.mjs NODE_MODULES_DIR BASE_URL API_KEY
// models.list and models.retrieve (and an unknown id's NotFoundError), a greedy completion and
// the same completion streamed (its deltas make the same text; with stream_options.include_usage
// its usage), chat.completions.create plain, streamed and with logprobs, embeddings.create, a bad
// request's BadRequestError,
// and a wrong key's AuthenticationError. Prints one PASS/FAIL line a check; exits 1 on a failure.
import { createRequire } from "node:module";
import path from "node:path";

const [modules, baseURL, apiKey] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), "index.js"));
const OpenAI = require("openai");

let failed = 0;
function check(ok, what, detail) {
  console.log(`${ok ? "PASS" : "FAIL"} ${what}${ok ? "" : "  " + JSON.stringify(detail)}`);
  if (!ok) failed++;
}

const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

const list = await client.models.list();
const models = [];
for await (const m of list) models.push(m);
check(models.length === 1 && models[0].object === "model" && typeof models[0].created === "number",
      "models.list: the served model", models);
const id = models[0].id;
const one = await client.models.retrieve(id);
check(one.id === id && one.object === "model" && one.created === models[0].created && one.owned_by === "qkv",
      "models.retrieve(id)", one);
try {
  await client.models.retrieve("no-such-model");
  check(false, "models.retrieve of an unknown id throws", null);
} catch (e) {
  check(e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === "model_not_found",
        "models.retrieve of an unknown id: NotFoundError, model_not_found", { status: e.status, code: e.code });
}

const ask = { model: id, prompt: "And God said", max_tokens: 12, temperature: 0 };
const done = await client.completions.create(ask);
check(done.object === "text_completion" && done.choices.length === 1 && typeof done.choices[0].text === "string" &&
      done.usage.total_tokens === done.usage.prompt_tokens + done.usage.completion_tokens,
      "completions.create", done);
const stream = await client.completions.create({ ...ask, stream: true });
let text = "", chunks = 0;
for await (const c of stream) {
  text += c.choices[0]?.text ?? "";
  chunks++;
}
check(chunks > 0 && text === done.choices[0].text, "completions.create with stream: the same text", { text, chunks });
const counted = await client.completions.create({ ...ask, stream: true, stream_options: { include_usage: true } });
let usage = null;
for await (const c of counted) if (c.usage) usage = c.usage;
check(usage !== null && JSON.stringify(usage) === JSON.stringify(done.usage),
      "stream_options.include_usage: the stream's usage is the plain completion's", { usage, want: done.usage });

// chat, as most applications call it: the answer, then the same answer streamed (role first,
// content deltas, the finish), then with logprobs
const talk = { model: id, messages: [{ role: "system", content: "Count." }, { role: "user", content: "And God said" }],
               max_tokens: 12, temperature: 0 };
const reply = await client.chat.completions.create(talk);
check(reply.object === "chat.completion" && reply.choices.length === 1 && reply.choices[0].message.role === "assistant" &&
      typeof reply.choices[0].message.content === "string" && reply.usage.completion_tokens > 0,
      "chat.completions.create", reply);
const chatStream = await client.chat.completions.create({ ...talk, stream: true });
let said = "", role = null, finish = null;
for await (const c of chatStream) {
  const d = c.choices[0]?.delta ?? {};
  if (d.role) role = d.role;
  said += d.content ?? "";
  if (c.choices[0]?.finish_reason) finish = c.choices[0].finish_reason;
}
check(role === "assistant" && said === reply.choices[0].message.content && finish === reply.choices[0].finish_reason,
      "chat.completions.create with stream: the role, the same text, the finish", { role, said, finish });
const scored = await client.chat.completions.create({ ...talk, logprobs: true, top_logprobs: 2 });
const lps = scored.choices[0].logprobs?.content ?? [];
check(lps.length === scored.usage.completion_tokens && lps.every(t => typeof t.logprob === "number" &&
      Array.isArray(t.bytes) && t.top_logprobs.length === 2), "chat logprobs with top_logprobs", lps.slice(0, 1));

// embeddings: the client asks for base64 by default and decodes it; the vectors equal the float answer
const emb = await client.embeddings.create({ model: id, input: ["And God said", "let there be light"] });
const plain = await fetch(`${baseURL}/embeddings`, {
  method: "POST", headers: { "Content-Type": "application/json", Authorization: `Bearer ${apiKey}` },
  body: JSON.stringify({ input: ["And God said", "let there be light"], encoding_format: "float" }),
}).then(r => r.json());
check(emb.data.length === 2 && emb.data.every((d, i) => d.index === i && d.embedding.length === plain.data[i].embedding.length &&
      d.embedding.every((v, k) => Math.fround(v) === Math.fround(plain.data[i].embedding[k]))) && emb.usage.prompt_tokens > 0,
      "embeddings.create (base64 on the wire): the float vectors", { n: emb.data.length });

try {
  await client.completions.create({ ...ask, max_tokens: -1 });
  check(false, "a bad max_tokens throws", null);
} catch (e) {
  check(e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === "max_tokens",
        "a bad max_tokens: BadRequestError naming the field", { status: e.status, param: e.param });
}
try {
  await new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 }).models.list();
  check(false, "a wrong key throws", null);
} catch (e) {
  check(e instanceof OpenAI.AuthenticationError && e.status === 401, "a wrong key: AuthenticationError",
        { status: e.status });
}
console.log(failed ? `${failed} failed` : "all passed");
process.exit(failed ? 1 : 0);
