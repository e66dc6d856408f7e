// qkv/train.h: training a Model: AdamW with decoupled weight decay, learning-rate schedules,
// clipping by global norm, gradient accumulation, skipping of non-finite steps, and exact
// checkpoints.
//
// One Trainer::step() = forward + backward of each micro-batch (their mean loss), then one
// AdamW update. With the same seed, data and thread count, every loss and every parameter is
// bitwise identical from run to run, and resuming from a checkpoint continues exactly as if
// training had never stopped.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "qkv/distributed.h"
#include "qkv/model.h"
#include "qkv/rng.h"
#include "qkv/schedule.h"

namespace qkv {

class GradientReducer;
class Bf16WeightBuffers;

// The arithmetic of a training step's matrix products (every linear layer, forward and backward).
// BF16: their inputs rounded to bfloat16, products summed in float32 (qkv::Bf16Matmul, on the CPU's
// bf16 dot products where it has them); the master weights, gradients, AdamW's moments, attention,
// norms, losses and reductions stay float32. F32: everything float32.
enum class Precision { F32, BF16 };
const char* precision_name(Precision p);  // "f32", "bf16"
// "f32" or "bf16"; anything else is an error naming `what`.
Precision parse_precision(const std::string& s, const std::string& what);

struct TrainConfig {
  Precision precision = Precision::F32;
  Schedule schedule;              // learning rate per step
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.01;     // applied to Parameter::decay parameters only (see decay_all)
  bool decay_all = false;         // decay every parameter, as torch.optim.AdamW(model.parameters())
  double clip_norm = 0.0;         // > 0: scale gradients so their global L2 norm is at most this
  float label_smoothing = 0.0f;
  uint64_t seed = 0;              // dropout masks and the data-order RNG
  // How micro-batches combine. false: the mean of each micro-batch's mean token loss. true: the
  // sum of every micro-batch's token losses divided by their total count, the loss of one batch
  // holding them all; what data parallelism computes (forced on with a Communicator), so that N
  // ranks give the update of one process accumulating the same N parts.
  bool token_mean = false;
  // Data parallelism: gradients are summed over the ranks in buckets of about this many bytes,
  // each as soon as the backward pass has finished it (results do not depend on it).
  int64_t bucket_bytes = int64_t{4} << 20;
};

struct StepReport {
  int64_t step = 0;         // 1-based number of this step
  double loss = 0;          // mean over micro-batches of each one's mean token loss
  double grad_norm = 0;     // global L2 norm before clipping
  double lr = 0;
  bool skipped = false;     // loss or gradient norm not finite: parameters and optimiser state untouched
  int64_t tokens = 0;       // counted (non-ignored) targets (with token_mean or ranks: all ranks')
  double comm_seconds = 0;  // with a communicator: time spent waiting for sums over the ranks
  int64_t buckets = 0;         // ... gradient buckets summed
  int64_t buckets_early = 0;   // ... of which started while the backward pass was still running
  bool resummed = false;       // ... a gradient was written after its bucket left: all summed again
};

class Trainer {
 public:
  Trainer(Model& model, TrainConfig config);

  // One optimiser step over these micro-batches (gradient accumulation: the gradient is the
  // mean of the micro-batches' gradients, or with token_mean their token-weighted mean). Throws on
  // bad input; never on a non-finite loss. With a communicator every rank calls step() together
  // with its own micro-batches (possibly none): their gradients are summed over the ranks in rank
  // order and normalised by the global token count, the loss and grad_norm reported are the
  // global ones, and every rank applies the same update.
  StepReport step(const std::vector<Batch>& micro_batches);

  // Data parallelism over comm's ranks (null: this process alone). The communicator must outlive
  // the trainer's use of it.
  void set_communicator(Communicator* comm) { comm_ = comm; }
  Communicator* communicator() const { return comm_; }

  int64_t steps_done() const { return step_; }      // steps attempted (the schedule's clock)
  int64_t updates_done() const { return updates_; } // steps applied (AdamW's bias-correction count)
  int64_t skipped_steps() const { return step_ - updates_; }
  const TrainConfig& config() const { return config_; }
  Rng& rng() { return rng_; }  // for data shuffling: saved in checkpoints
  Model& model() { return model_; }

  // A single safetensors file: parameters ("model.<name>"), AdamW moments ("adam_m.<name>",
  // "adam_v.<name>"), and metadata (config, step counters, schedule, RNG state, `data_state`).
  // Written atomically: temporary file, fsync, rename.
  void save_checkpoint(const std::string& path, const std::string& data_state = "") const;
  // Restores everything save_checkpoint wrote into this trainer and its model (including the
  // training settings: schedule, AdamW hyper-parameters, clipping, label smoothing, seed, which
  // replace this trainer's), and returns the data_state string. The model's config must equal
  // the checkpoint's. On any error nothing is changed.
  std::string load_checkpoint(const std::string& path);
  // The same from a checkpoint's contents already read (`path` names it in messages).
  std::string load_checkpoint(const SafetensorsFile& f, const std::string& path);

 private:
  Model& model_;
  TrainConfig config_;
  std::vector<Tensor> m_, v_;
  int64_t step_ = 0, updates_ = 0;
  Rng rng_;
  Communicator* comm_ = nullptr;
  std::shared_ptr<GradientReducer> reducer_;  // data parallelism's gradient buckets (src/train/grad_reducer.h)
  int64_t reducer_bytes_ = 0;
  std::shared_ptr<Bf16WeightBuffers> bf16_buffers_;  // bf16: the weights' rounded copies, kept from step to step
};

// The model config stored in a checkpoint (to build the Model before load_checkpoint), and the
// precision it trains in (F32 for checkpoints older than the setting); both read the header only.
ModelConfig checkpoint_model_config(const std::string& path);
Precision checkpoint_precision(const std::string& path);

}  // namespace qkv
