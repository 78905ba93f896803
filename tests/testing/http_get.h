// A minimal blocking HTTP/1.0 GET for tests (reading /metrics from 127.0.0.1), and one
// sample of the Prometheus text it returns.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace kvc::testing {

// Returns the whole response (status line, headers, body), or "" on connection failure.
inline std::string HttpGet(const std::string& host_port, const std::string& path) {
  const auto colon = host_port.rfind(':');
  const std::string host = host_port.substr(0, colon);
  const int port = std::stoi(host_port.substr(colon + 1));
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "";
  }
  const std::string request =
      "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";
  if (::send(fd, request.data(), request.size(), 0) != static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return "";
  }
  std::string response;
  char buf[8192];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) response.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return response;
}

// The value of one sample (`series` as exposed, labels sorted, e.g.
// `kvc_x_total{pool="a"}`) in a Prometheus text exposition, or -1 when absent.
inline double MetricSample(const std::string& text, const std::string& series) {
  const auto pos = text.find("\n" + series + " ");
  if (pos == std::string::npos) return -1;
  return std::stod(text.substr(pos + series.size() + 2));
}

}  // namespace kvc::testing
