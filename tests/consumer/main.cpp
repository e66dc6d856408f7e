// Prints the chapter's output [5.912, 4.088] through the installed library; and uses the installed
// server (qkv::server), whose public header must need nothing beyond the standard library (no Boost).
#include <qkv/qkv.h>
#include <qkv/server.h>

#include <cmath>
#include <cstdio>
#include <string>

int main() {
  const qkv::ServerOptions options;
  if (options.port != 8080 || !options.page.empty()) return 1;
  try {
    qkv::ServerOptions o;
    o.model = "/nonexistent/model";
    qkv::Server server(o);  // no model there: an error naming it
    return 1;
  } catch (const qkv::Error& e) {
    if (std::string(e.what()).find("/nonexistent/model") == std::string::npos) return 1;
  }
  qkv::Tensor q = qkv::Tensor::from<float>({1, 2}, {std::sqrt(2.0f), 0.0f});
  qkv::Tensor k = qkv::Tensor::from<float>({3, 2}, {1, 0, 0, 1, 1, 1});
  qkv::Tensor v = qkv::Tensor::from<float>({3, 2}, {10, 0, 0, 10, 4, 6});
  qkv::AttentionOutput r = qkv::attention(q, k, v);
  std::printf("[%.3f, %.3f]\n", r.out.data<float>()[0], r.out.data<float>()[1]);
  return 0;
}
