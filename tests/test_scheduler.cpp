// The scheduler (qkv/scheduler.h): requests from many threads decode together with continuous
// batching and get exactly what each gets alone (greedy) or with its seed (sampling); a full
// queue refuses; a sink that says stop frees its slot; jobs run between steps; drain waits for
// everything in flight; bad requests are refused before they queue.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "error_testing.h"
#include "qkv/scheduler.h"

namespace qkv {
namespace {

using testing::error_of;

Model decoder(uint64_t seed = 5) {
  ModelConfig c;
  c.arch = Arch::Decoder;
  c.vocab_size = 29;
  c.d_model = 16;
  c.n_heads = 4;
  c.d_ff = 32;
  c.n_layers = 2;
  c.positional = Positional::Rope;
  c.norm_first = true;
  c.eos_id = 1;
  c.init_std = 0.3;
  Model m(c);
  m.init(seed);
  return m;
}

// Collects one request's events; wait() returns the tokens of each choice.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::string> finish;
  std::vector<std::vector<double>> logprobs;  // per choice, per token (with top_logprobs > 0)
  std::vector<int64_t> cached;                // per choice: the first event's prompt_cached
  int64_t ended = 0, n;
  int64_t stop_after = -1;  // > 0: the sink says stop after this many tokens of choice 0
  explicit Collector(int64_t choices)
      : tokens(static_cast<size_t>(choices)), finish(static_cast<size_t>(choices)),
        logprobs(static_cast<size_t>(choices)), cached(static_cast<size_t>(choices), -1), n(choices) {}
  TokenSink sink() {
    return [this](const TokenEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (e.token >= 0) {
        if (tokens[e.choice].empty()) cached[e.choice] = e.prompt_cached;
        tokens[e.choice].push_back(e.token);
        logprobs[e.choice].push_back(e.logprob);
      }
      const bool stop = stop_after > 0 && static_cast<int64_t>(tokens[e.choice].size()) >= stop_after;
      if (e.last || stop) {
        finish[e.choice] = e.last ? e.finish : "stopped by the sink";
        ++ended;
        cv.notify_all();
      }
      return !stop;
    };
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return ended == n; });
  }
};

TEST(Scheduler, ConcurrentRequestsEqualEachAlone) {
  const Model m = decoder();
  Scheduler s(m, {.slots = 4, .max_len = 48, .max_queue = 64});
  const std::vector<std::vector<int32_t>> prompts = {{4, 9, 7}, {6}, {11, 3, 8, 2, 5}, {12, 12}, {7}, {3, 4, 5, 6}};
  std::vector<std::unique_ptr<Collector>> got;
  for (size_t i = 0; i < prompts.size(); ++i) got.push_back(std::make_unique<Collector>(2));
  std::vector<std::thread> clients;
  for (size_t i = 0; i < prompts.size(); ++i)
    clients.emplace_back([&, i] {
      std::this_thread::sleep_for(std::chrono::milliseconds(3 * i));  // arrive while others decode
      CompletionRequest r;
      r.prompt = prompts[i];
      r.max_tokens = 10;
      r.n = 2;
      r.sampling.greedy = i % 2 == 0;
      r.sampling.seed = 100 + i;
      s.submit(r, got[i]->sink());
      got[i]->wait();
    });
  for (auto& t : clients) t.join();
  for (size_t i = 0; i < prompts.size(); ++i) {
    // alone: greedy is generate()'s; sampling draws choice c from seed + c, as generate() with that seed
    for (int64_t c = 0; c < 2; ++c) {
      GenerateConfig g;
      g.max_new_tokens = 10;
      g.eos_id = -1;
      g.sampling.greedy = i % 2 == 0;
      g.sampling.seed = 100 + i + static_cast<uint64_t>(c);
      EXPECT_EQ(got[i]->tokens[c], generate(m, {prompts[i]}, g)[0].tokens) << "request " << i << " choice " << c;
      EXPECT_EQ(got[i]->finish[c], "length");
    }
  }
  EXPECT_GT(s.steps(), 0);
  EXPECT_EQ(s.decoding(), 0);
}

// A prompt cache changes what runs, never what comes out: the same requests through a scheduler
// with one and without give bitwise the same tokens and log-probabilities; the first token's
// event says how many prompt tokens came from the cache.
TEST(Scheduler, PromptCacheReusesPrefixesAndChangesNoResult) {
  const Model m = decoder();
  const std::vector<int32_t> system = {4, 9, 7, 12, 5, 6, 11, 3, 8, 10};  // a shared "system prompt"
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t q : {2, 13, 17}) {
    std::vector<int32_t> p = system;
    p.insert(p.end(), {q, q, 5});
    prompts.push_back(p);
  }
  std::vector<int32_t> chat = prompts[0];  // a growing chat: the first prompt, an answer, more
  chat.insert(chat.end(), {20, 21, 22, 23, 24, 25});
  prompts.push_back(chat);
  const auto run = [&](int64_t cache_bytes, bool cache_prompt) {
    Scheduler s(m, {.slots = 2, .max_len = 48, .max_queue = 8, .prompt_chunk = 4, .prompt_cache_bytes = cache_bytes});
    std::vector<std::unique_ptr<Collector>> got;
    for (size_t i = 0; i < prompts.size(); ++i) {  // one after another: each finds the ones before
      got.push_back(std::make_unique<Collector>(2));
      CompletionRequest r;
      r.prompt = prompts[i];
      r.max_tokens = 6;
      r.n = 2;
      r.top_logprobs = 1;
      r.cache_prompt = cache_prompt;
      r.sampling.greedy = i % 2 == 0;
      r.sampling.seed = 7 + i;
      s.submit(r, got.back()->sink());
      got.back()->wait();
    }
    return std::make_pair(std::move(got), s.prompt_stats());
  };
  const auto [with, stats] = run(1 << 20, true);
  const auto [without, none] = run(0, true);
  const auto [refused, unused] = run(1 << 20, false);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(with[i]->tokens, without[i]->tokens) << "request " << i;
    EXPECT_EQ(with[i]->logprobs, without[i]->logprobs) << "request " << i;  // bitwise
    EXPECT_EQ(refused[i]->tokens, without[i]->tokens) << "request " << i;
    EXPECT_EQ(without[i]->cached, std::vector<int64_t>(2, 0));
    EXPECT_EQ(refused[i]->cached, std::vector<int64_t>(2, 0));
  }
  // request 0: nothing cached; its second choice finds the first's 12 tokens (13 in the prompt,
  // the last chunk still runs: 12 = 3 chunks of 4); the others share 10 tokens: 8
  EXPECT_EQ(with[0]->cached, (std::vector<int64_t>{0, 12}));
  EXPECT_EQ(with[1]->cached, (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(with[3]->cached, (std::vector<int64_t>{12, 16}));  // the chat: request 0's 12, then its own 16
  int64_t reused = 0, total = 0;
  for (size_t i = 0; i < prompts.size(); ++i)
    for (int64_t c : with[i]->cached) reused += c;
  for (const auto& p : prompts) total += 2 * static_cast<int64_t>(p.size());
  EXPECT_EQ(stats.reused_tokens, reused);
  EXPECT_EQ(stats.prompt_tokens, total);
  EXPECT_GT(stats.cache.tokens, 0);
  EXPECT_EQ(none.reused_tokens, 0);
  EXPECT_EQ(unused.cache.entries, 0);
}

// Slot reports say which request's choice each slot decodes; the latency histograms count every
// request's first token and every later token of every choice.
TEST(Scheduler, SlotReportsAndLatencies) {
  const Model m = decoder();
  Scheduler s(m, {.slots = 3, .max_len = 48, .max_queue = 8});
  std::vector<SlotReport> seen;
  Collector got(2);
  const TokenSink inner = got.sink();
  CompletionRequest r;
  r.prompt = {4, 9, 7};
  r.max_tokens = 6;
  r.n = 2;
  r.id = "cmpl-1";
  int64_t tokens1 = 0;
  s.submit(r, [&](const TokenEvent& e) {
    if (e.choice == 1 && e.token >= 0 && ++tokens1 == 3) seen = s.slot_reports();  // mid-way
    return inner(e);
  });
  got.wait();
  s.drain();
  ASSERT_EQ(seen.size(), 3u);
  int64_t busy = 0;
  for (const SlotReport& x : seen) {
    if (!x.busy) continue;
    ++busy;
    EXPECT_EQ(x.request, "cmpl-1");
    EXPECT_EQ(x.prompt_tokens, 3);
    EXPECT_EQ(x.max_tokens, 6);
    EXPECT_GE(x.generated, 1);
    EXPECT_LE(x.generated, 6);
  }
  EXPECT_EQ(busy, 2);
  for (const SlotReport& x : s.slot_reports()) EXPECT_FALSE(x.busy);
  const auto [ttft, tpot] = s.latencies();
  EXPECT_EQ(ttft.count, 1);            // one request
  EXPECT_EQ(tpot.count, 2 * (6 - 1));  // every token after each choice's first
  int64_t in_buckets = 0;
  for (int64_t c : tpot.counts) in_buckets += c;
  EXPECT_EQ(in_buckets, tpot.count);
  EXPECT_GE(tpot.sum, 0.0);
}

TEST(Scheduler, EosStopsAChoiceAndASinkCanStopIt) {
  const Model m = decoder();
  Scheduler s(m, {.slots = 2, .max_len = 48, .max_queue = 8});
  GenerateConfig g;
  g.max_new_tokens = 6;
  g.eos_id = -1;
  const std::vector<int32_t> free_run = generate(m, {{4, 9}}, g)[0].tokens;
  CompletionRequest r;
  r.prompt = {4, 9};
  r.max_tokens = 6;
  r.eos_id = free_run[2];  // its third token (or an earlier one equal to it) ends it
  const auto end = std::find(free_run.begin(), free_run.end(), free_run[2]) + 1;
  Collector a(1);
  s.submit(r, a.sink());
  a.wait();
  EXPECT_EQ(a.tokens[0], std::vector<int32_t>(free_run.begin(), end));
  EXPECT_EQ(a.finish[0], "stop");
  Collector b(1);
  b.stop_after = 2;
  r.eos_id = -1;
  s.submit(r, b.sink());
  b.wait();
  EXPECT_EQ(b.tokens[0].size(), 2u);
  s.drain();
  EXPECT_EQ(s.decoding(), 0);  // its slot was freed
}

TEST(Scheduler, FullQueueRefusesAndJobsRunBetweenSteps) {
  const Model m = decoder();
  // the collectors outlive the scheduler: it may still tell them "cancelled" when it stops
  std::vector<std::shared_ptr<Collector>> c;
  for (int i = 0; i < 4; ++i) c.push_back(std::make_shared<Collector>(1));
  Scheduler s(m, {.slots = 1, .max_len = 200, .max_queue = 2});
  // a long request holds the only slot; two more wait; the fourth is refused
  CompletionRequest r;
  r.prompt = {4};
  r.max_tokens = 150;
  s.submit(r, c[0]->sink());
  while (s.decoding() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  s.submit(r, c[1]->sink());
  s.submit(r, c[2]->sink());
  std::string refused;
  try {
    s.submit(r, c[3]->sink());
  } catch (const QueueFull& e) {
    refused = e.what();
  }
  EXPECT_NE(refused.find("the queue is full (2 requests waiting)"), std::string::npos) << refused;
  for (int i = 0; i < 3; ++i) c[i]->wait();
  // a job runs on the scheduler thread and hands back its value or its exception
  auto f = s.run([](const Model& model) { return model.config().vocab_size; });
  EXPECT_EQ(f.get(), 29);
  auto bad = s.run([](const Model&) -> int { throw Error("job failed"); });
  EXPECT_EQ(error_of([&] { bad.get(); }), "job failed");
}

TEST(Scheduler, BadRequestsAreRefusedBeforeTheyQueue) {
  const Model m = decoder();
  Scheduler s(m, {.slots = 2, .max_len = 16, .max_queue = 4});
  const auto submit = [&](CompletionRequest r) {
    Collector c(r.n);
    return error_of([&] { s.submit(r, c.sink()); });
  };
  CompletionRequest ok;
  ok.prompt = {4};
  ok.max_tokens = 4;
  CompletionRequest r = ok;
  r.prompt = {};
  EXPECT_NE(submit(r).find("no tokens"), std::string::npos);
  r = ok;
  r.prompt = {40};
  EXPECT_NE(submit(r).find("outside the vocabulary"), std::string::npos);
  r = ok;
  r.max_tokens = 16;
  EXPECT_NE(submit(r).find("exceed the context of 16"), std::string::npos);
  r = ok;
  r.n = 3;
  EXPECT_NE(submit(r).find("the decoding slots"), std::string::npos);
  s.drain();
  EXPECT_NE(submit(ok).find("shutting down"), std::string::npos);
}

}  // namespace
}  // namespace qkv
