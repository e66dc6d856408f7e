// qkv/scheduler.h: one thread that owns a model and serves requests from many threads.
//
// Completions (decoder-only models) run with continuous batching over DecodeSlots: a request
// that arrives while others decode joins the batch between two steps, once enough slots are free
// for its choices, and leaves when its choices end (an end-of-sequence token, max_tokens, or its
// caller stopping it: a stop string, a client gone). Every other use of the model (translation,
// classification, next-token probabilities, attention maps) runs on the same thread between
// steps, as a job, so the model is only ever used by one thread. The queue is bounded: a request
// beyond it is refused at once, never queued without limit.
//
//   Scheduler s(model, {.slots = 8, .max_len = 512, .max_queue = 64});
//   CompletionRequest r{.prompt = ids, .max_tokens = 32};
//   auto t = s.submit(r, [](const TokenEvent& e) { ...; return true; });   // on the scheduler thread
//   auto fut = s.run([&](const Model& m) { return translate(m, src, g); });
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "qkv/error.h"
#include "qkv/generate.h"
#include "qkv/model.h"

namespace qkv {

struct SchedulerOptions {
  int64_t slots = 8;        // sequences decoded together (a request's choices each take one)
  int64_t max_len = 512;    // prompt + generated tokens of one sequence at most
  int64_t max_queue = 64;   // requests (and jobs) waiting at most; beyond it submit() refuses
  int64_t prompt_chunk = 0;        // prompt tokens run together (DecodeSlotsOptions; 0: one pass)
  int64_t prompt_cache_bytes = 0;  // past prompts' keys and values kept for reuse (0: none)
};

// Constrained decoding (structured output): which tokens may come next. Each choice decodes with
// its own copy (clone); before every choice of a token the scheduler asks allowed() and the
// logits of the others become -infinity for that choice (the reported log-probabilities stay the
// model's), then advance() hears the token chosen. A constraint that allows no token ends the
// choice with an error. Greedy choices and sampling without top_k / top_p first try the token
// chosen from the whole row and build the mask only when it is not allowed: the same token for
// greedy, and for sampling the same distribution (p(t) / the allowed mass), drawn differently.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  virtual std::unique_ptr<TokenConstraint> clone() const = 0;
  virtual void allowed(std::vector<char>& mask) const = 0;  // mask: V entries, set to 1 where allowed
  virtual bool allows(int32_t token) const = 0;             // one token: what allowed() would say of it
  virtual void advance(int32_t token) = 0;
};

struct CompletionRequest {
  std::shared_ptr<const TokenConstraint> constraint;  // optional: each choice decodes under its copy
  std::vector<int32_t> prompt;  // non-empty, ids in the vocabulary
  int64_t max_tokens = 16;      // new tokens per choice (>= 1)
  SamplingConfig sampling;      // greedy or sampled; choice i samples from seed + i
  int64_t n = 1;                // choices (each its own sequence)
  int64_t top_logprobs = 0;     // the k most probable tokens per step, with their log-probabilities
  int64_t eos_id = -1;          // a choice ends after this token (-1: never)
  bool cache_prompt = true;     // reuse a cached prefix of the prompt and keep this one (when the
                                // scheduler has a prompt cache); the results are the same either way
  std::string id;               // shown in slot reports (a server's completion id)
};

// One generated token of one choice, or the end of a choice.
struct TokenEvent {
  int64_t choice = 0;
  int32_t token = -1;     // -1 for an end without a token (the request was stopped or failed)
  double logprob = 0;     // log p(token) under the model (temperature 1), when top_logprobs > 0
  std::vector<std::pair<int32_t, double>> top;  // top_logprobs (token, log p), most probable first
  bool last = false;      // the choice ends here
  std::string finish;     // with last: "stop" (eos), "length" (max_tokens or max_len), "cancelled",
                          // or "error: <message>"
  int64_t prompt_cached = 0;  // on a choice's first token: prompt tokens taken from the prompt cache
};

// Called on the scheduler thread for every event; return false to end this choice now (its slot
// is freed before the next step). It must be quick: hand the event to the request's own thread.
using TokenSink = std::function<bool(const TokenEvent&)>;

// What a decoding slot is doing (Scheduler::slot_reports).
struct SlotReport {
  int64_t slot = 0;
  bool busy = false;
  std::string request;  // CompletionRequest::id
  int64_t choice = 0, prompt_tokens = 0, prompt_cached = 0, generated = 0, max_tokens = 0;
};

// Latencies seen so far, as Prometheus histograms: counts[i] observations <= bounds[i] (not
// cumulative here), the last entry for those above every bound; sum in seconds.
struct LatencyHistogram {
  std::vector<double> bounds;
  std::vector<int64_t> counts;  // bounds.size() + 1
  double sum = 0;
  int64_t count = 0;
  explicit LatencyHistogram(std::vector<double> b = {}) : bounds(std::move(b)), counts(bounds.size() + 1, 0) {}
  void add(double seconds);
};

// Refused because the queue is full (an HTTP server's 429).
class QueueFull : public Error {
 public:
  using Error::Error;
};

class Scheduler {
 public:
  Scheduler(const Model& model, const SchedulerOptions& options);
  ~Scheduler();  // stops: what is queued is refused ("cancelled"), what decodes ends "cancelled"
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const Model& model() const { return model_; }
  const SchedulerOptions& options() const { return opt_; }

  // Queues a completion (decoder-only models). Throws QueueFull when max_queue requests wait,
  // qkv::Error for a request that can never run (its prompt + max_tokens over max_len, n over
  // the slots, an id outside the vocabulary) or after drain() began.
  void submit(CompletionRequest request, TokenSink sink);

  // Runs `job` on the scheduler thread, between decoding steps; its result (or exception) comes
  // back through the future. Throws QueueFull / qkv::Error as submit() does.
  template <class F>
  auto run(F job) -> std::future<decltype(job(std::declval<const Model&>()))> {
    using R = decltype(job(std::declval<const Model&>()));
    auto task = std::make_shared<std::packaged_task<R(const Model&)>>(std::move(job));
    std::future<R> f = task->get_future();
    enqueue_job([task](const Model& m) { (*task)(m); });
    return f;
  }

  // Stops accepting work and returns once every queued and running request and job has ended.
  void drain();

  // For a health check and tests: requests waiting, sequences decoding, steps run so far.
  int64_t waiting() const;
  int64_t decoding() const;
  int64_t steps() const;
  // The prompt cache as of the last request admitted, and the prompt tokens reused and run so far.
  struct PromptStats {
    DecodeSlots::CacheStats cache;
    int64_t reused_tokens = 0, prompt_tokens = 0;
  };
  PromptStats prompt_stats() const;
  // Every slot: idle, or which request's choice it decodes and how far it is.
  std::vector<SlotReport> slot_reports() const;
  // Time to first token (from submit() to a request's first token) and time per output token
  // (between a choice's successive tokens).
  std::pair<LatencyHistogram, LatencyHistogram> latencies() const;

 private:
  struct Choice;
  struct Pending;
  void enqueue_job(std::function<void(const Model&)> job);
  void loop();
  void admit(std::unique_lock<std::mutex>& lock);
  void step_once();

  const Model& model_;
  SchedulerOptions opt_;
  std::unique_ptr<DecodeSlots> slots_;  // null for a model that is not decoder-only
  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<std::unique_ptr<Pending>> pending_;
  std::deque<std::function<void(const Model&)>> jobs_;
  std::vector<std::unique_ptr<Choice>> active_;  // owned by the scheduler thread
  int64_t active_count_ = 0, steps_ = 0;
  PromptStats prompt_stats_;
  LatencyHistogram ttft_, tpot_;
  void report_slots();  // refreshes reports_ (scheduler thread)
  std::vector<SlotReport> reports_;
  bool stopping_ = false, draining_ = false, busy_ = false;
  std::thread thread_;
};

}  // namespace qkv
