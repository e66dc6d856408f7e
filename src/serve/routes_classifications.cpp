// /v1/classifications: a classifier's label and the probability of every label, per text.
#include <algorithm>
#include <cmath>
#include <string>

#include "models/model_dir.h"
#include "serve/server_impl.h"

namespace qkv::serve {

void ServerImpl::classifications(const http::Request& req, http::Response& res) {
  Fields f(req.body);
  const std::vector<std::string> texts = f.strings("text", 256, true, false);
  f.done();
  std::vector<std::vector<int32_t>> rows;
  for (const std::string& t : texts) rows.push_back(classifier_ids(*tok_, t, info_.max_len));
  const std::vector<std::vector<float>> z = sched_->run([&rows](const Model& m) {
    std::vector<std::vector<float>> out;
    for (const auto& ids : rows) {
      const Tensor l = logits_of(m, ids);
      out.emplace_back(l.data<float>(), l.data<float>() + l.numel());
    }
    return out;
  }).get();
  Json results = Json::array();
  for (const auto& row : z) {
    double mx = -INFINITY, sum = 0;
    for (float v : row) {
      if (!std::isfinite(v)) throw HttpError{500, "the model's logits are not finite", "server_error", ""};
      mx = std::max(mx, static_cast<double>(v));
    }
    for (float v : row) sum += std::exp(static_cast<double>(v) - mx);
    Json probs = Json::object();
    size_t best = 0;
    for (size_t k = 0; k < row.size(); ++k) {
      probs[info_.labels.at(k)] = std::exp(static_cast<double>(row[k]) - mx) / sum;
      if (row[k] > row[best]) best = k;
    }
    results.push_back({{"label", info_.labels.at(best)}, {"prob", probs[info_.labels.at(best)]}, {"probs", probs}});
  }
  res.body = dump({{"model", id_}, {"classifications", results}});
}

}  // namespace qkv::serve
