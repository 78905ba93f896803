// A real kvcached process for multi-process tests: spawned with its output in files, its gRPC
// address read from its log, and the signals the fault tests send (SIGKILL, SIGSTOP/SIGCONT,
// SIGTERM). Killed with the object.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace kvc::testing {

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The text after `prefix` up to the next space or newline in `path`, waiting up to `timeout`;
// "" if it never appears.
inline std::string WaitForLogWord(const std::string& path, const std::string& prefix,
                                  std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    const std::string text = ReadWholeFile(path);
    const size_t at = text.find(prefix);
    if (at != std::string::npos) {
      const size_t end = text.find_first_of(" \n", at + prefix.size());
      if (end != std::string::npos)
        return text.substr(at + prefix.size(), end - at - prefix.size());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return "";
}

inline pid_t SpawnWithOutput(const std::vector<std::string>& args, const std::string& out_path,
                             const std::string& err_path) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0600);
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  return rc == 0 ? pid : -1;
}

class KvcachedProcess {
 public:
  // Starts `binary` with `args` (add --listen; 127.0.0.1:0 picks a free port). Check
  // target() for "" (it did not come up; Log() says why).
  KvcachedProcess(std::string binary, std::string dir, std::vector<std::string> args)
      : binary_(std::move(binary)), dir_(std::move(dir)), args_(std::move(args)) {
    Start();
  }
  KvcachedProcess(const KvcachedProcess&) = delete;
  KvcachedProcess& operator=(const KvcachedProcess&) = delete;
  ~KvcachedProcess() { Kill(); }

  // Starts it again (after Kill) on the port it had, so clients that know the address find it.
  void Restart() {
    Kill();
    for (std::string& a : args_) {
      if (a.rfind("--listen=", 0) == 0 && !target_.empty()) a = "--listen=" + target_;
    }
    Start();
  }
  const std::string& target() const { return target_; }
  pid_t pid() const { return pid_; }
  void Signal(int signal) const {
    if (pid_ > 0) kill(pid_, signal);
  }
  // SIGSTOP, returning once every thread of the process is stopped (signal delivery is
  // asynchronous: a call sent right after kill() could still be answered).
  bool Stop(std::chrono::milliseconds timeout = std::chrono::seconds(10)) const {
    Signal(SIGSTOP);
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      bool all_stopped = true;
      std::error_code ec;
      for (const auto& task :
           std::filesystem::directory_iterator("/proc/" + std::to_string(pid_) + "/task", ec)) {
        const std::string stat = ReadWholeFile(task.path().string() + "/stat");
        const size_t paren = stat.rfind(')');
        if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'T') {
          all_stopped = false;
        }
      }
      if (all_stopped && !ec) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  void Kill() {
    if (Reaped()) return;
    kill(pid_, SIGCONT);  // a stopped process cannot die until it runs
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // Waits for the process to exit by itself; its exit status (128 + signal when killed), or
  // -1 on timeout.
  int WaitExit(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (pid_ > 0 && std::chrono::steady_clock::now() < until) {
      if (Reaped()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return pid_ > 0 ? -1 : exit_status_;
  }
  std::string Log() const { return ReadWholeFile(log_path()); }

 private:
  std::string log_path() const { return dir_ + "/kvcached." + std::to_string(starts_) + ".log"; }
  // Whether the process has exited (then pid_ is -1 and exit_status_ says how).
  bool Reaped() {
    int status = 0;
    if (pid_ <= 0 || waitpid(pid_, &status, WNOHANG) != pid_) return pid_ <= 0;
    pid_ = -1;
    exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return true;
  }
  void Start() {
    ++starts_;
    std::vector<std::string> argv = {binary_};
    argv.insert(argv.end(), args_.begin(), args_.end());
    pid_ = SpawnWithOutput(argv, dir_ + "/kvcached.out", log_path());
    target_.clear();
    // Until it says where it listens, or exits (a refused config), or a minute passes.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (target_.empty() && !Reaped() && std::chrono::steady_clock::now() < until) {
      target_ = WaitForLogWord(log_path(), "kvcached listening on ", std::chrono::milliseconds(50));
    }
  }

  std::string binary_;
  std::string dir_;
  std::vector<std::string> args_;
  pid_t pid_ = -1;
  int starts_ = 0;
  int exit_status_ = -1;
  std::string target_;
};

}  // namespace kvc::testing
