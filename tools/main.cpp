// qkv: the command-line tool. Library errors (qkv::Error) become one line on stderr and exit 2.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "mpi_comm.h"
#include "qkv/qkv.h"

namespace {

// One line for a command-line error. A word where a command belongs ("qkv frobnicate", "qkv
// bench frobnicate") reaches CLI11 as an unexpected argument, which it reports as "A subcommand
// is required": name the word and the commands instead.
std::string parse_error_line(const CLI::App& app, const CLI::ParseError& e) {
  const CLI::App* at = &app;
  std::string path = "qkv";
  for (bool deeper = true; deeper;) {
    deeper = false;
    for (const CLI::App* sub : at->get_subcommands()) {
      at = sub;
      path += " " + sub->get_name();
      deeper = true;
      break;
    }
  }
  const std::string what = e.what();
  if (what.find("subcommand") == std::string::npos || at->get_require_subcommand_min() == 0 ||
      !at->get_subcommands().empty())
    return what;
  std::string names;
  for (const CLI::App* sub : at->get_subcommands({})) names += (names.empty() ? "" : ", ") + sub->get_name();
  for (const std::string& word : app.remaining(true))
    if (!word.empty() && word[0] != '-')
      return "'" + word + "' is not a " + path + " command; expected one of " + names;
  return path + " needs a command: one of " + names;
}

// CPU seconds the whole machine has been busy, from /proc/stat's first line: all but idle and
// iowait (steal included: on a virtual machine, time the host gave to others). -1 if unreadable.
double machine_busy_seconds() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  if (!(f >> cpu) || cpu != "cpu") return -1;
  double v[8] = {};  // user nice system idle iowait irq softirq steal (guest is within user)
  for (double& x : v)
    if (!(f >> x)) return -1;
  return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Cores' worth of CPU that other processes used over the next `seconds` (-1 if unknown).
double others_busy_cores(double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  const double b0 = machine_busy_seconds(), own0 = process_cpu_seconds();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const double b1 = machine_busy_seconds(), own1 = process_cpu_seconds();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (b0 < 0 || b1 < 0 || dt <= 0) return -1;
  return std::max(0.0, (b1 - b0) - (own1 - own0)) / dt;
}

bool wants_help(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) return true;
  return argc < 2;
}

// Settings that only take effect when the libraries load, before main(): set them and start
// again (execv of /proc/self/exe: the same arguments and process id), once.
//
// 1. Debian's OpenBLAS 0.3.21 does not recognise some recent CPUs and silently runs its generic
//    (Prescott) kernel, several times slower: set OPENBLAS_CORETYPE.
// 2. How OpenMP threads wait (libgomp, the one runtime of qkv's kernels, OpenBLAS and oneDNN).
//    By default a thread that waits for the others spins for about 3 ms before it sleeps. On an
//    idle machine that is what makes small parallel regions fast (waking a sleeping thread costs
//    ~100 us on a virtual machine); on a machine where another process is busy it is ruinous: a
//    thread spins on a core while the thread it waits for queues behind the other process, and
//    10 completions of a tiny model took 10x longer. No fixed spin count serves both
//    (BENCHMARKS.md, "Threads on a busy machine"), so qkv looks: when other processes keep at
//    least half a core busy over 50 ms at start, threads wait passively (OMP_WAIT_POLICY=passive);
//    otherwise libgomp's default stands. OMP_WAIT_POLICY or GOMP_SPINCOUNT set by the user win,
//    and so does an mpirun start (its ranks divide the cores among themselves).
void reexec_with_load_time_settings(int argc, char** argv) {
  if (std::getenv("QKV_NO_REEXEC")) return;
  bool again = false;
  const qkv::BlasInfo info = qkv::blas_info();
  if (!std::getenv("OPENBLAS_CORETYPE") && info.generic_fallback) {
    const std::string kv = info.advice;  // "OPENBLAS_CORETYPE=Haswell"
    const auto eq = kv.find('=');
    setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
    again = true;
  }
  if (!std::getenv("OMP_WAIT_POLICY") && !std::getenv("GOMP_SPINCOUNT") && !wants_help(argc, argv) &&
      !qkv::cli::launched_by_mpi()) {
    const double others = others_busy_cores(0.05);
    if (others >= 0.5) {
      setenv("OMP_WAIT_POLICY", "passive", 1);
      char why[96];
      std::snprintf(why, sizeof why, "passive (other processes kept %.1f cores busy at start)", others);
      setenv("QKV_THREADS_WAIT", why, 1);
      again = true;
    }
  }
  if (!again) return;
  setenv("QKV_NO_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);
  // execv failed: carry on as we are, but say what is slow.
  if (info.generic_fallback)
    std::cerr << "qkv: warning: OpenBLAS runs its generic '" << info.corename << "' kernel; set " << info.advice
              << " for full speed\n";
}

// Which command ran out of memory, how much there was, and the options that size its work.
std::string out_of_memory(CLI::App& app) {
  const std::string cmd = app.get_subcommands().empty() ? std::string("qkv") : app.get_subcommands().front()->get_name();
  const char* hint = cmd == "train"   ? "a smaller --max-tokens, --max-len or --preset"
                     : cmd == "bench" ? "smaller sizes"
                     : cmd == "fit" || cmd == "forward" || cmd == "attend" ? "smaller inputs or a smaller model"
                                                                           : "a smaller --batch, --beam or --max-len";
  return qkv::detail::concat("qkv ", cmd, " ran out of memory (",
                             static_cast<long long>(qkv::available_memory_bytes() / (1 << 20)),
                             " MiB available); try ", hint);
}

}  // namespace

int main(int argc, char** argv) {
  reexec_with_load_time_settings(argc, argv);
  // Before any thread exists: SIGINT and SIGTERM are never handled on a computing thread
  // (qkv/signals.h says why).
  try {
    qkv::block_stop_signals();
  } catch (const qkv::Error& e) {
    std::cerr << "qkv: error: " << e.what() << "\n";
    return 2;
  }
  CLI::App app{"qkv: the transformer, from the attention formula up, on the CPU"};
  app.require_subcommand(1);
  app.fallthrough();  // --threads also after the subcommand: qkv attend --threads 1
  int threads = 0;
  app.add_option("--threads", threads, "Threads for every kernel (default: QKV_NUM_THREADS, else all cores)")
      ->transform(qkv::cli::whole(0, 4096));
  std::vector<qkv::cli::Runner> runners;
  runners.push_back(qkv::cli::add_attend(app));
  runners.push_back(qkv::cli::add_bench(app));
  runners.push_back(qkv::cli::add_init(app));
  runners.push_back(qkv::cli::add_import(app));
  runners.push_back(qkv::cli::add_export(app));
  runners.push_back(qkv::cli::add_quantize(app));
  runners.push_back(qkv::cli::add_forward(app));
  runners.push_back(qkv::cli::add_fit(app));
  runners.push_back(qkv::cli::add_train(app));
  runners.push_back(qkv::cli::add_translate(app));
  runners.push_back(qkv::cli::add_generate(app));
  runners.push_back(qkv::cli::add_classify(app));
  runners.push_back(qkv::cli::add_fill_mask(app));
  runners.push_back(qkv::cli::add_serve(app));
  runners.push_back(qkv::cli::add_chat_template(app));
  runners.push_back(qkv::cli::add_explore(app));
  runners.push_back(qkv::cli::add_tour(app));
  runners.push_back(qkv::cli::add_eval(app));
  runners.push_back(qkv::cli::add_tokenize(app));
  runners.push_back(qkv::cli::add_data(app));
  runners.push_back(qkv::cli::add_plot(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "qkv: error: " << parse_error_line(app, e) << "\n";
    return 2;
  }
  try {
    if (threads > 0) {
      qkv::set_num_threads(threads);
    } else if (qkv::cli::launched_by_mpi() && !std::getenv("QKV_NUM_THREADS")) {
      // ranks on one machine share its cores
      qkv::set_num_threads(std::max(1, qkv::num_threads() / qkv::cli::local_ranks()));
    }
    CLI::App* chosen = app.get_subcommands().front();
    const auto& all = app.get_subcommands({});
    for (size_t i = 0; i < all.size(); ++i)
      if (all[i] == chosen) return runners[i]();
    return 2;
  } catch (const qkv::FailedOnLead&) {
    return 2;  // (data parallelism: rank 0 failed and printed why; another rank says nothing more)
  } catch (const qkv::Error& e) {
    qkv::cli::restore_error_output();
    const std::string what = e.what();
    std::cerr << "qkv: error: " << what;
    if (what.find("cannot allocate") != std::string::npos) std::cerr << "; " << out_of_memory(app);
    std::cerr << "\n";
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    // "filesystem error: status: Too many levels of symbolic links [x]" -> "x: too many levels ..."
    qkv::cli::restore_error_output();
    std::string why = e.code().message();
    if (!why.empty()) why[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(why[0])));
    std::cerr << "qkv: error: " << (e.path1().empty() ? std::string("a file") : e.path1().string()) << ": " << why
              << (e.path2().empty() ? std::string() : " (and " + e.path2().string() + ")") << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    qkv::cli::restore_error_output();
    std::cerr << "qkv: error: " << out_of_memory(app) << "\n";
    return 2;
  } catch (const std::exception& e) {
    qkv::cli::restore_error_output();
    std::cerr << "qkv: error: " << e.what() << "\n";
    return 2;
  }
}
