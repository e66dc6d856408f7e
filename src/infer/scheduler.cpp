// The scheduler thread: jobs first, then the requests that fit the free slots join (their
// prompts run, their first tokens are chosen), then one decoding step for every live choice.
// Sinks are called without the scheduler's lock held.
#include "qkv/scheduler.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <numeric>

namespace qkv {

using Clock = std::chrono::steady_clock;

struct Scheduler::Pending {
  CompletionRequest req;
  TokenSink sink;
  Clock::time_point submitted = Clock::now();
  bool answered = false;  // its first token went out (time to first token recorded)
};

struct Scheduler::Choice {
  std::shared_ptr<Pending> req;
  int64_t index = 0, slot = -1, generated = 0;
  Rng rng;
  std::vector<int32_t> history;  // prompt + generated
  bool done = false;
  std::unique_ptr<TokenConstraint> constraint;  // this choice's copy of the request's, if any
  int64_t prompt_cached = 0;
  Clock::time_point last_token;
  Choice(std::shared_ptr<Pending> r, int64_t i) : req(std::move(r)), index(i), rng(req->req.sampling.seed + static_cast<uint64_t>(i)) {
    if (req->req.constraint) constraint = req->req.constraint->clone();
  }
};

void LatencyHistogram::add(double seconds) {
  size_t i = 0;
  while (i < bounds.size() && seconds > bounds[i]) ++i;
  ++counts[i];
  sum += seconds;
  ++count;
}

namespace {

// Prometheus-style buckets: time to first token up to a minute, per output token up to 10 s.
const std::vector<double> kTtftBounds = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
const std::vector<double> kTpotBounds = {0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 10};

// The token a choice picks from its row of logits: under its constraint (the disallowed tokens'
// logits -infinity in a copy of the row) when it has one, which then hears the token.
int32_t choose_constrained(const float* z, int64_t V, const std::vector<int32_t>& history, const SamplingConfig& s,
                           Rng& rng, size_t generated_from, TokenConstraint* c) {
  if (!c) return choose_token(z, V, history, s, rng, generated_from);
  if (s.greedy || (s.top_k == 0 && s.top_p >= 1.0f)) {
    // the unmasked choice, when allowed: greedy's is the masked argmax; a sample t is kept with
    // probability p(t), else redrawn from the masked row, which gives p(t) / (allowed mass)
    const int32_t t = choose_token(z, V, history, s, rng, generated_from);
    if (c->allows(t)) {
      c->advance(t);
      return t;
    }
  }
  std::vector<char> mask(static_cast<size_t>(V), 0);
  c->allowed(mask);
  std::vector<float> row(z, z + V);
  bool any = false;
  for (int64_t v = 0; v < V; ++v) {
    if (!mask[static_cast<size_t>(v)]) row[static_cast<size_t>(v)] = -std::numeric_limits<float>::infinity();
    any = any || mask[static_cast<size_t>(v)];
  }
  check(any, "the output constraint allows no token of this vocabulary here");
  const int32_t t = choose_token(row.data(), V, history, s, rng, generated_from);
  c->advance(t);
  return t;
}

// The event for the token chosen from `z`; with k > 0 its log-probability and the k most probable
// tokens (a softmax over the vocabulary, skipped when nobody asked).
TokenEvent event_for(const float* z, int64_t V, int32_t token, int64_t k) {
  TokenEvent e;
  e.token = token;
  if (k <= 0) return e;
  const std::vector<double> lp = log_softmax_row(z, V);
  e.logprob = lp[static_cast<size_t>(token)];
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t n = std::min(k, V);
  std::partial_sort(idx.begin(), idx.begin() + n, idx.end(),
                    [&](int32_t a, int32_t b) { return lp[a] > lp[b] || (lp[a] == lp[b] && a < b); });
  for (int64_t i = 0; i < n; ++i) e.top.emplace_back(idx[i], lp[idx[i]]);
  return e;
}

}  // namespace

Scheduler::Scheduler(const Model& model, const SchedulerOptions& options)
    : model_(model), opt_(options), ttft_(kTtftBounds), tpot_(kTpotBounds) {
  check(opt_.slots >= 1 && opt_.slots <= 4096, "scheduler: slots ", opt_.slots, " (expected 1 .. 4096)");
  check(opt_.max_queue >= 1, "scheduler: max_queue ", opt_.max_queue, " (expected >= 1)");
  const ModelConfig& c = model.config();
  if (c.arch == Arch::Decoder) {
    if (c.positional == Positional::Learned) opt_.max_len = std::min(opt_.max_len, c.max_len);
    check(opt_.max_len >= 2, "scheduler: max_len ", opt_.max_len, " (expected >= 2)");
    slots_ = std::make_unique<DecodeSlots>(model, opt_.slots, opt_.max_len,
                                           DecodeSlotsOptions{opt_.prompt_chunk, opt_.prompt_cache_bytes});
    reports_.resize(static_cast<size_t>(opt_.slots));
    for (int64_t i = 0; i < opt_.slots; ++i) reports_[static_cast<size_t>(i)].slot = i;
  }
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Scheduler::submit(CompletionRequest r, TokenSink sink) {
  const ModelConfig& c = model_.config();
  check(slots_ != nullptr, "completions need a decoder-only model; this one is ", arch_name(c.arch));
  check(!r.prompt.empty(), "the prompt has no tokens");
  for (size_t i = 0; i < r.prompt.size(); ++i)
    check(r.prompt[i] >= 0 && r.prompt[i] < c.vocab_size, "prompt token ", i, " = ", r.prompt[i],
          " is outside the vocabulary [0, ", c.vocab_size, ")");
  check(r.max_tokens >= 1, "max_tokens ", r.max_tokens, " (expected >= 1)");
  check(static_cast<int64_t>(r.prompt.size()) + r.max_tokens <= opt_.max_len, "the prompt (", r.prompt.size(),
        " tokens) + max_tokens (", r.max_tokens, ") exceed the context of ", opt_.max_len, " tokens");
  check(r.n >= 1 && r.n <= opt_.slots, "n ", r.n, " (expected 1 .. ", opt_.slots, ", the decoding slots)");
  check(r.top_logprobs >= 0 && r.top_logprobs <= c.vocab_size, "top_logprobs ", r.top_logprobs, " (expected 0 .. ",
        c.vocab_size, ")");
  {
    std::lock_guard<std::mutex> lock(mu_);
    check(!draining_ && !stopping_, "the server is shutting down");
    if (static_cast<int64_t>(pending_.size() + jobs_.size()) >= opt_.max_queue)
      throw QueueFull(detail::concat("the queue is full (", opt_.max_queue, " requests waiting)"));
    pending_.push_back(std::make_unique<Pending>(Pending{std::move(r), std::move(sink)}));
  }
  wake_.notify_all();
}

void Scheduler::enqueue_job(std::function<void(const Model&)> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    check(!draining_ && !stopping_, "the server is shutting down");
    if (static_cast<int64_t>(pending_.size() + jobs_.size()) >= opt_.max_queue)
      throw QueueFull(detail::concat("the queue is full (", opt_.max_queue, " requests waiting)"));
    jobs_.push_back(std::move(job));
  }
  wake_.notify_all();
}

void Scheduler::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  draining_ = true;
  wake_.notify_all();
  idle_.wait(lock, [&] { return pending_.empty() && jobs_.empty() && active_count_ == 0 && !busy_; });
}

int64_t Scheduler::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(pending_.size() + jobs_.size());
}

int64_t Scheduler::decoding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_count_;
}

int64_t Scheduler::steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return steps_;
}

Scheduler::PromptStats Scheduler::prompt_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return prompt_stats_;
}

std::vector<SlotReport> Scheduler::slot_reports() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reports_;
}

std::pair<LatencyHistogram, LatencyHistogram> Scheduler::latencies() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {ttft_, tpot_};
}

void Scheduler::report_slots() {
  std::vector<SlotReport> r(reports_.size());
  for (size_t i = 0; i < r.size(); ++i) r[i].slot = static_cast<int64_t>(i);
  for (const auto& ch : active_) {
    if (ch->done || ch->slot < 0) continue;
    SlotReport& s = r[static_cast<size_t>(ch->slot)];
    const CompletionRequest& q = ch->req->req;
    s.busy = true;
    s.request = q.id;
    s.choice = ch->index;
    s.prompt_tokens = static_cast<int64_t>(q.prompt.size());
    s.prompt_cached = ch->prompt_cached;
    s.generated = ch->generated;
    s.max_tokens = q.max_tokens;
  }
  std::lock_guard<std::mutex> lock(mu_);
  reports_ = std::move(r);
}

void Scheduler::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    // work: a job, a request that fits the free slots (all are free when nothing decodes), a step
    wake_.wait(lock, [&] {
      const bool fits = !pending_.empty() && slots_ && pending_.front()->req.n <= slots_->free_slots();
      return stopping_ || !jobs_.empty() || fits || active_count_ > 0;
    });
    if (stopping_) break;
    busy_ = true;
    while (!jobs_.empty()) {
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job(model_);  // a packaged_task: its exception goes to the future
      lock.lock();
    }
    admit(lock);
    if (active_count_ > 0) {
      lock.unlock();
      step_once();
      lock.lock();
      ++steps_;
    }
    busy_ = false;
    idle_.notify_all();
  }
  // stopping: what waits and what decodes ends, told as "cancelled"
  std::deque<std::unique_ptr<Pending>> pending = std::move(pending_);
  jobs_.clear();
  lock.unlock();
  TokenEvent end;
  end.last = true;
  end.finish = "cancelled";
  for (auto& p : pending)
    for (int64_t i = 0; i < p->req.n; ++i) end.choice = i, p->sink(end);
  for (auto& ch : active_)
    if (!ch->done) end.choice = ch->index, ch->req->sink(end);
  active_.clear();
  lock.lock();
  active_count_ = 0;
  idle_.notify_all();
}

void Scheduler::admit(std::unique_lock<std::mutex>& lock) {
  const int64_t V = model_.config().vocab_size;
  while (!pending_.empty() && slots_ && pending_.front()->req.n <= slots_->free_slots()) {
    std::shared_ptr<Pending> p(pending_.front().release());
    pending_.pop_front();
    lock.unlock();
    const CompletionRequest& r = p->req;
    for (int64_t i = 0; i < r.n; ++i) {
      auto ch = std::make_unique<Choice>(p, i);
      ch->history = r.prompt;
      TokenEvent e;
      try {
        std::vector<float> z;
        ch->slot = slots_->add(r.prompt, &z, r.cache_prompt, &e.prompt_cached);
        ch->prompt_cached = e.prompt_cached;
        {
          std::lock_guard<std::mutex> stats(mu_);
          prompt_stats_.cache = slots_->prompt_cache();
          prompt_stats_.reused_tokens += e.prompt_cached;
          prompt_stats_.prompt_tokens += static_cast<int64_t>(r.prompt.size());
        }
        const int32_t t = choose_constrained(z.data(), V, ch->history, r.sampling, ch->rng, r.prompt.size(), ch->constraint.get());
        const int64_t cached = e.prompt_cached;
        e = event_for(z.data(), V, t, r.top_logprobs);
        e.prompt_cached = cached;
      } catch (const Error& err) {
        if (ch->slot >= 0) slots_->remove(ch->slot);
        e.last = true;
        e.finish = std::string("error: ") + err.what();
      }
      e.choice = i;
      if (!e.last) {
        ch->last_token = Clock::now();
        if (!p->answered) {
          p->answered = true;
          std::lock_guard<std::mutex> stats(mu_);
          ttft_.add(std::chrono::duration<double>(ch->last_token - p->submitted).count());
        }
        ch->history.push_back(e.token);
        ch->generated = 1;
        if (e.token == r.eos_id) e.last = true, e.finish = "stop";
        else if (ch->generated >= r.max_tokens) e.last = true, e.finish = "length";
      }
      const bool go_on = p->sink(e) && !e.last;
      if (!go_on) {
        if (ch->slot >= 0) slots_->remove(ch->slot);
        continue;
      }
      active_.push_back(std::move(ch));
    }
    report_slots();
    lock.lock();
    active_count_ = static_cast<int64_t>(active_.size());
  }
}

void Scheduler::step_once() {
  const int64_t V = model_.config().vocab_size;
  std::vector<std::pair<int64_t, int32_t>> feed;
  for (const auto& ch : active_) feed.emplace_back(ch->slot, ch->history.back());
  std::vector<float> z;
  std::string failure;
  try {
    z = slots_->step(feed);
  } catch (const Error& err) {
    failure = err.what();
  }
  const Clock::time_point now = Clock::now();  // every choice's token of this step
  std::vector<double> gaps;                     // time per output token, recorded once below
  for (size_t i = 0; i < active_.size(); ++i) {
    Choice& ch = *active_[i];
    const CompletionRequest& r = ch.req->req;
    TokenEvent e;
    if (!failure.empty()) {
      e.last = true;
      e.finish = "error: " + failure;
    } else {
      const float* row = z.data() + static_cast<int64_t>(i) * V;
      int32_t t = -1;
      try {
        t = choose_constrained(row, V, ch.history, r.sampling, ch.rng, r.prompt.size(), ch.constraint.get());
      } catch (const Error& err) {
        e.last = true;
        e.finish = std::string("error: ") + err.what();
      }
      if (t >= 0) {
        gaps.push_back(std::chrono::duration<double>(now - ch.last_token).count());
        ch.last_token = now;
        e = event_for(row, V, t, r.top_logprobs);
        ch.history.push_back(t);
        ++ch.generated;
        if (t == r.eos_id) e.last = true, e.finish = "stop";
        else if (ch.generated >= r.max_tokens) e.last = true, e.finish = "length";
      }
    }
    e.choice = ch.index;
    const bool go_on = ch.req->sink(e) && !e.last;
    if (!go_on) {
      slots_->remove(ch.slot);
      ch.done = true;
    }
  }
  active_.erase(std::remove_if(active_.begin(), active_.end(), [](const std::unique_ptr<Choice>& c) { return c->done; }),
                active_.end());
  report_slots();
  std::lock_guard<std::mutex> lock(mu_);
  for (double g : gaps) tpot_.add(g);
  active_count_ = static_cast<int64_t>(active_.size());
}

}  // namespace qkv
