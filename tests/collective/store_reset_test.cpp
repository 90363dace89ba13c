// c10d 1.13's TCPStore client aborts its process when it connects while the server closes:
// the connection is reset from the server's accept queue, the client's callback thread
// (TCPStoreWorkerDaemon) reads the reset as a watch response and its std::system_error
// ("Connection reset by peer") escapes the thread. hmc's socket guards (lib/src/collective/
// socket_guards.hpp) turn that reset into the "closed" c10d handles. The case reproduces the
// abort in a child process: without the guards the child dies of SIGABRT.

#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>  // defines a glog CHECK: doctest macros are spelt DOCTEST_*

#include "collective/socket_guards.hpp"

namespace {

// In the child: a listener that never accepts, a store client whose two connections wait in
// its accept queue, then the listener closes (as a store server does when its rank exits).
int clientOfAClosingServer() {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) return 10;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      ::listen(listener, 16) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return 11;
  }
  c10d::TCPStoreOptions options;
  options.port = ntohs(address.sin_port);
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = std::chrono::seconds(5);
  c10d::TCPStore client("127.0.0.1", options);
  ::close(listener);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the callback thread reads
  return 0;
}

}  // namespace

TEST_CASE("hmc's socket guards are this process's bind() and recv()") {
  DOCTEST_CHECK(hmc::detail::socketGuardsInstalled());
}

TEST_CASE("a store client survives its server closing with the client in the accept queue") {
  const pid_t child = ::fork();
  DOCTEST_REQUIRE(child >= 0);
  if (child == 0) {
    int code = 12;
    try {
      code = clientOfAClosingServer();
    } catch (const std::exception& error) {
      code = 13;
    }
    ::_exit(code);
  }
  int status = 0;
  pid_t done = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((done = ::waitpid(child, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (done == 0) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    DOCTEST_FAIL("the child still ran after 60 s (killed)");
  }
  DOCTEST_INFO("child status: ",
               WIFSIGNALED(status)
                   ? std::string("killed by signal ") + ::strsignal(WTERMSIG(status))
                   : "exit " + std::to_string(WEXITSTATUS(status)));
  DOCTEST_CHECK(WIFEXITED(status));
  DOCTEST_CHECK(WEXITSTATUS(status) == 0);
}
