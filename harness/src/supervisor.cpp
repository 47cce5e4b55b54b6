#include "supervisor.hpp"

#include "flashbench/errors.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>
#include <thread>

namespace fb {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A worker that fails to start this many times in a row on one device takes that device out of the run.
constexpr int kMaxFailedStarts = 3;

struct Worker {
  int device = 0;
  pid_t pid = -1;
  int to_child = -1;          // its stdin
  int from_child = -1;        // its result fd
  std::string buffer;         // bytes read but not yet a full line
  bool ready = false;         // hello received
  bool retiring = false;      // said it exits after its last record (context lost): no more tasks
  std::optional<size_t> task; // index into the current run's task vector
  std::string phase;
  Clock::time_point spawned, dispatched;
  std::string last_affinity;
  int failed_starts = 0;
  bool disabled = false;
  std::string last_failure;

  bool alive() const { return pid > 0; }
};

} // namespace

std::string describe_wait_status(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return "signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    if (code == kExitContextLost)
      return "exit status " + std::to_string(code) + " (CUDA context lost)";
    return "exit status " + std::to_string(code);
  }
  return "status " + std::to_string(status);
}

struct Supervisor::Impl {
  SupervisorOptions opts;
  std::vector<Worker> workers;
  int started = 0;

  void spawn(Worker &w) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0)
      throw std::runtime_error(std::string("pipe2 failed: ") + std::strerror(errno));
    std::vector<std::string> args = {opts.exe,      "worker",
                                     "--device",    std::to_string(w.device),
                                     "--result-fd", std::to_string(kWorkerResultFd)};
    if (opts.worker_args)
      for (auto &a : opts.worker_args(w.device, started == 0))
        args.push_back(std::move(a));
    std::vector<char *> argv;
    for (auto &a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0)
      throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
    if (pid == 0) {
      // Child: only async-signal-safe calls until exec (the parent may have threads).
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent)
        _exit(1);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigaction(SIGPIPE, &dfl, nullptr);
      dup2(in[0], 0);
      if (out[1] == kWorkerResultFd)
        fcntl(out[1], F_SETFD, 0);
      else
        dup2(out[1], kWorkerResultFd);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    fcntl(out[0], F_SETFL, fcntl(out[0], F_GETFL) | O_NONBLOCK);
    w.pid = pid;
    w.to_child = in[1];
    w.from_child = out[0];
    w.buffer.clear();
    w.ready = false;
    w.retiring = false;
    w.task.reset();
    w.phase.clear();
    w.last_affinity.clear();
    w.spawned = Clock::now();
    ++started;
    if (opts.verbose)
      std::fprintf(stderr, "flashbench: started worker pid %d on GPU %d\n", pid, w.device);
  }

  // Closes the pipes and reaps the process (it must already be exiting or killed). Returns the wait status.
  int reap(Worker &w) {
    if (w.to_child >= 0)
      close(w.to_child);
    if (w.from_child >= 0)
      close(w.from_child);
    w.to_child = w.from_child = -1;
    int status = 0;
    while (waitpid(w.pid, &status, 0) < 0 && errno == EINTR) {
    }
    w.pid = -1;
    w.ready = false;
    return status;
  }

  void kill_worker(Worker &w) {
    if (!w.alive())
      return;
    kill(w.pid, SIGKILL);
    reap(w);
  }

  void stop_all() {
    for (auto &w : workers)
      if (w.alive() && w.to_child >= 0) {
        close(w.to_child);
        w.to_child = -1;
      }
    const auto t0 = Clock::now();
    for (auto &w : workers) {
      if (!w.alive())
        continue;
      int status = 0;
      while (waitpid(w.pid, &status, WNOHANG) == 0 && seconds_since(t0) < 10)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (waitpid(w.pid, &status, WNOHANG) == 0)
        kill(w.pid, SIGKILL);
      reap(w);
    }
  }
};

Supervisor::Supervisor(SupervisorOptions opts) : impl_(std::make_unique<Impl>()) {
  impl_->opts = std::move(opts);
  if (impl_->opts.exe.empty()) {
    std::error_code ec;
    impl_->opts.exe = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    if (ec)
      throw std::runtime_error("cannot resolve /proc/self/exe: " + ec.message());
  }
  if (impl_->opts.devices.empty())
    impl_->opts.devices = {0};
  for (int d : impl_->opts.devices) {
    Worker w;
    w.device = d;
    impl_->workers.push_back(w);
  }
  // A worker that dies while we write its next task must not kill the supervisor.
  signal(SIGPIPE, SIG_IGN);
}

Supervisor::~Supervisor() { impl_->stop_all(); }

int Supervisor::workers_started() const { return impl_->started; }

void Supervisor::run(const std::vector<SupervisorTask> &tasks, const SupervisorCallbacks &cb) {
  Impl &s = *impl_;
  std::deque<size_t> pending;
  for (size_t i = 0; i < tasks.size(); ++i)
    pending.push_back(i);
  std::vector<int> requeued(tasks.size(), 0);
  size_t done = 0;

  auto finish_lost = [&](Worker &w, Status st, const std::string &reason) {
    const size_t t = *w.task;
    w.task.reset();
    ++done;
    if (cb.on_lost)
      cb.on_lost(tasks[t].id, st, reason);
  };

  // Picks the next task for a worker: the first pending one with the worker's last problem, else the first.
  auto take = [&](Worker &w) -> size_t {
    auto it = std::find_if(pending.begin(), pending.end(), [&](size_t t) {
      return !w.last_affinity.empty() && tasks[t].affinity == w.last_affinity;
    });
    if (it == pending.end())
      it = pending.begin();
    const size_t t = *it;
    pending.erase(it);
    return t;
  };

  auto handle_exit = [&](Worker &w) {
    const bool was_ready = w.ready;
    const int status = s.reap(w);
    const std::string how = describe_wait_status(status);
    if (w.task && w.phase == "dispatch" && requeued[*w.task] < 2) {
      // It died before it started this task (between points): the task never ran, so it goes back to the queue.
      ++requeued[*w.task];
      pending.push_front(*w.task);
      w.task.reset();
    } else if (w.task) {
      finish_lost(w, Status::crashed,
                  "worker process (GPU " + std::to_string(w.device) + ") died with " + how +
                      (w.phase.empty() ? std::string() : " during " + w.phase) +
                      "; no record was written");
    }
    if (!was_ready && WIFEXITED(status) && WEXITSTATUS(status) == kExitUserError)
      throw UserError("a worker on GPU " + std::to_string(w.device) +
                      " refused its arguments (its message is above); fix them and run again");
    if (!was_ready) {
      ++w.failed_starts;
      w.last_failure =
          "worker on GPU " + std::to_string(w.device) + " ended before it was ready (" + how + ")";
      std::fprintf(stderr, "flashbench: %s\n", w.last_failure.c_str());
      if (w.failed_starts >= kMaxFailedStarts)
        w.disabled = true;
    } else if (s.opts.verbose) {
      std::fprintf(stderr, "flashbench: worker on GPU %d ended (%s)\n", w.device, how.c_str());
    }
  };

  auto handle_line = [&](Worker &w, const std::string &line) {
    nlohmann::json m;
    try {
      m = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception &) {
      std::fprintf(stderr, "flashbench: ignoring malformed worker message: %.200s\n", line.c_str());
      return;
    }
    const std::string type = m.value("type", "");
    if (type == "hello") {
      w.ready = true;
      w.failed_starts = 0;
      if (cb.on_hello)
        cb.on_hello(m);
    } else if (type == "phase") {
      w.phase = m.value("phase", "");
    } else if (type == "result") {
      if (!w.task || tasks[*w.task].id != m.value("id", size_t(-1))) {
        std::fprintf(stderr,
                     "flashbench: ignoring a result for a point the worker was not given\n");
        return;
      }
      const size_t t = *w.task;
      w.task.reset();
      w.retiring = m.value("exiting", false);
      ++done;
      if (cb.on_record)
        cb.on_record(tasks[t].id, m.value("record", nlohmann::json::object()));
    }
  };

  while (done < tasks.size()) {
    // Start workers where needed, and hand out tasks to idle ready ones.
    bool any_usable = false;
    for (auto &w : s.workers) {
      if (w.disabled)
        continue;
      any_usable = true;
      if (!w.alive() && !pending.empty())
        s.spawn(w);
      if (w.alive() && w.ready && !w.retiring && !w.task && !pending.empty()) {
        const size_t t = take(w);
        nlohmann::json payload = tasks[t].payload;
        payload["id"] = tasks[t].id;
        const std::string line = payload.dump() + "\n";
        w.task = t;
        w.phase = "dispatch";
        w.dispatched = Clock::now();
        w.last_affinity = tasks[t].affinity;
        size_t off = 0;
        while (off < line.size()) {
          const ssize_t n = write(w.to_child, line.data() + off, line.size() - off);
          if (n < 0 && errno == EINTR)
            continue;
          if (n <= 0)
            break; // the worker is gone; its EOF is handled below
          off += static_cast<size_t>(n);
        }
      }
    }
    if (!any_usable) {
      std::string why = "no worker could start";
      for (auto &w : s.workers)
        if (!w.last_failure.empty())
          why = w.last_failure;
      for (auto &w : s.workers)
        if (w.task)
          finish_lost(w, Status::crashed, why);
      while (!pending.empty()) {
        const size_t t = pending.front();
        pending.pop_front();
        ++done;
        if (cb.on_lost)
          cb.on_lost(tasks[t].id, Status::crashed, "not run: " + why);
      }
      break;
    }

    // Wait for messages, at most until the nearest deadline.
    std::vector<pollfd> fds;
    std::vector<Worker *> owners;
    double wait_s = 1.0;
    for (auto &w : s.workers) {
      if (!w.alive())
        continue;
      fds.push_back({w.from_child, POLLIN, 0});
      owners.push_back(&w);
      if (w.task)
        wait_s = std::min(wait_s, s.opts.point_timeout_s - seconds_since(w.dispatched));
      else if (!w.ready)
        wait_s = std::min(wait_s, s.opts.startup_timeout_s - seconds_since(w.spawned));
    }
    const int timeout_ms = static_cast<int>(std::clamp(wait_s, 0.0, 1.0) * 1000) + 1;
    const int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n < 0 && errno != EINTR)
      throw std::runtime_error(std::string("poll failed: ") + std::strerror(errno));
    for (size_t i = 0; n > 0 && i < fds.size(); ++i) {
      if (!fds[i].revents)
        continue;
      Worker &w = *owners[i];
      char chunk[65536];
      bool eof = false;
      for (;;) {
        const ssize_t r = read(w.from_child, chunk, sizeof chunk);
        if (r > 0) {
          w.buffer.append(chunk, static_cast<size_t>(r));
          continue;
        }
        if (r < 0 && errno == EINTR)
          continue;
        eof = r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
        break;
      }
      for (size_t nl; (nl = w.buffer.find('\n')) != std::string::npos;) {
        const std::string line = w.buffer.substr(0, nl);
        w.buffer.erase(0, nl + 1);
        if (!line.empty())
          handle_line(w, line);
      }
      if (eof)
        handle_exit(w);
    }

    // Deadlines: a point that ran too long, or a worker that never became ready.
    for (auto &w : s.workers) {
      if (!w.alive())
        continue;
      if (w.task && seconds_since(w.dispatched) > s.opts.point_timeout_s) {
        const std::string phase = w.phase;
        s.kill_worker(w);
        finish_lost(w, Status::timeout,
                    "no result after " + std::to_string(static_cast<int>(s.opts.point_timeout_s)) +
                        " s (point_timeout_s)" + (phase.empty() ? std::string() : ", in " + phase) +
                        "; the worker was killed (hung kernel?)");
      } else if (!w.ready && seconds_since(w.spawned) > s.opts.startup_timeout_s) {
        s.kill_worker(w);
        ++w.failed_starts;
        w.last_failure = "worker on GPU " + std::to_string(w.device) +
                         " did not become ready within " +
                         std::to_string(static_cast<int>(s.opts.startup_timeout_s)) + " s";
        if (w.failed_starts >= kMaxFailedStarts)
          w.disabled = true;
      }
    }
  }
}

} // namespace fb
