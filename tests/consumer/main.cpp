// Prints the chapter's output [5.912, 4.088] through the installed library; and compiles against
// the server's public header, which must need nothing beyond the standard library (no Boost).
#include <qkv/qkv.h>
#include <qkv/server.h>

#include <cmath>
#include <cstdio>

int main() {
  const qkv::ServerOptions options;
  if (options.port != 8080 || !options.page.empty()) return 1;
  qkv::Tensor q = qkv::Tensor::from<float>({1, 2}, {std::sqrt(2.0f), 0.0f});
  qkv::Tensor k = qkv::Tensor::from<float>({3, 2}, {1, 0, 0, 1, 1, 1});
  qkv::Tensor v = qkv::Tensor::from<float>({3, 2}, {10, 0, 0, 10, 4, 6});
  qkv::AttentionOutput r = qkv::attention(q, k, v);
  std::printf("[%.3f, %.3f]\n", r.out.data<float>()[0], r.out.data<float>()[1]);
  return 0;
}
