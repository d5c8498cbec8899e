// Channels in one process: addresses, transports, security, malformed input, limits.
#include "monarch/channel/channel.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "test_util.hpp"

using namespace monarch::channel;
using namespace std::chrono_literals;
using monarch::channel::testing::bytes;
using monarch::channel::testing::Inbox;
using monarch::channel::testing::text;
using monarch::channel::testing::unique_name;
using ::testing::HasSubstr;

namespace {

ChannelOptions opts() {
  ChannelOptions o;
  o.secret = "test-secret";
  return o;
}

TEST(ChannelAddr, ParsesEveryForm) {
  auto a = ChannelAddr::parse("inproc://x");
  EXPECT_EQ(a.transport, Transport::Inproc);
  EXPECT_EQ(a.name, "x");
  auto u = ChannelAddr::parse("unix:///tmp/s.sock");
  EXPECT_EQ(u.transport, Transport::Unix);
  EXPECT_FALSE(u.abstract);
  EXPECT_EQ(u.name, "/tmp/s.sock");
  auto ab = ChannelAddr::parse("unix://@job-7");
  EXPECT_TRUE(ab.abstract);
  EXPECT_EQ(ab.name, "job-7");
  auto t4 = ChannelAddr::parse("tcp://127.0.0.1:26600");
  EXPECT_EQ(t4.host, "127.0.0.1");
  EXPECT_EQ(t4.port, 26600);
  auto t6 = ChannelAddr::parse("tcp://[::1]:0");
  EXPECT_EQ(t6.host, "::1");
  EXPECT_EQ(t6.port, 0);
  auto nat = ChannelAddr::parse("tcp://gw.example:7000@tcp://0.0.0.0:26600");
  EXPECT_EQ(nat.host, "0.0.0.0");
  ASSERT_NE(nat.dial, nullptr);
  EXPECT_EQ(nat.dial_addr().host, "gw.example");
  EXPECT_EQ(nat.dial_addr().port, 7000);
  for (const char* s : {"inproc://x", "unix:///tmp/s.sock", "unix://@job-7", "tcp://127.0.0.1:1",
                        "tcp://[::1]:2", "tcp://gw:7000@tcp://0.0.0.0:26600"}) {
    EXPECT_EQ(ChannelAddr::parse(s).to_string(), s);
    EXPECT_EQ(ChannelAddr::parse(ChannelAddr::parse(s).to_string()), ChannelAddr::parse(s));
  }
}

TEST(ChannelAddr, RejectsBadInputWithAClearMessage) {
  auto err = [](const char* s) {
    try {
      ChannelAddr::parse(s);
    } catch (const ChannelError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(err("http://x:1"), HasSubstr("unknown scheme"));
  EXPECT_THAT(err("tcp://host"), HasSubstr("missing ':port'"));
  EXPECT_THAT(err("tcp://host:99999"), HasSubstr("'99999'"));
  EXPECT_THAT(err("tcp://host:12ab"), HasSubstr("'12ab'"));
  EXPECT_THAT(err("tcp://::1:5"), HasSubstr("brackets"));
  EXPECT_THAT(err("unix://relative"), HasSubstr("absolute"));
  EXPECT_THAT(err("inproc://"), HasSubstr("empty"));
  EXPECT_THAT(err("unix://@"), HasSubstr("empty"));
  EXPECT_THAT(err("tcp://a:1@unix:///x"), HasSubstr("same transport"));
  EXPECT_THAT(err("tcp://[::1:5"), HasSubstr("']'"));
  EXPECT_THAT(err("tcp://a:1@tcp://b:2@tcp://c:3"), HasSubstr("more than one '@'"));
  EXPECT_THAT(err("tcp://a:1@"), HasSubstr("DIAL@BIND"));
  EXPECT_THAT(err("tcp://a b:1"), HasSubstr("whitespace"));
  EXPECT_THAT(err("inproc://x\ny"), HasSubstr("control"));
}

// CH-1 on every transport: many messages, in order, none lost or duplicated.
class Transports : public ::testing::TestWithParam<std::string> {};

TEST_P(Transports, DeliversInOrderExactlyOnce) {
  IoRuntime io;
  Inbox inbox;
  auto l = Listener::serve(io, ChannelAddr::parse(GetParam()), opts(), inbox.handler());
  std::atomic<int> failures{0};
  auto s = Sender::connect(io, l->bound_addr(), opts(),
                           [&](Message&&, const std::string&) { ++failures; });
  constexpr int kN = 5000;
  for (int i = 0; i < kN; ++i) s->send(Message{{bytes(std::to_string(i))}});
  ASSERT_TRUE(inbox.wait_for_count(kN, 20s)) << "got " << inbox.count();
  auto got = inbox.texts();
  for (int i = 0; i < kN; ++i) ASSERT_EQ(got[i], std::to_string(i));
  EXPECT_EQ(failures.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(AllTransports, Transports,
                         ::testing::Values("inproc://" + unique_name("t"),
                                           "unix://" + ::testing::TempDir() + unique_name("t.sock"),
                                           "unix://@" + unique_name("t"), "tcp://127.0.0.1:0",
                                           "tcp://[::1]:0"));

TEST(Channel, PortZeroReportsTheBoundPort) {
  IoRuntime io;
  Inbox inbox;
  auto l = Listener::serve(io, ChannelAddr::parse("tcp://127.0.0.1:0"), opts(), inbox.handler());
  EXPECT_NE(l->bound_addr().port, 0);
  EXPECT_EQ(l->bound_addr().host, "127.0.0.1");
}

TEST(Channel, UnixSocketFileIsPrivate) {
  IoRuntime io;
  Inbox inbox;
  std::string path = ::testing::TempDir() + unique_name("private.sock");
  auto l = Listener::serve(io, ChannelAddr::parse("unix://" + path), opts(), inbox.handler());
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// A unix listen address may reuse a stale socket file (a listener that exited without unlinking
// it), but must not take over a live listener's path or delete a file that is not a socket.
TEST(Channel, UnixListenReusesOnlyAStaleSocket) {
  IoRuntime io;
  Inbox inbox;
  auto serve = [&](const std::string& path) {
    return Listener::serve(io, ChannelAddr::parse("unix://" + path), opts(), inbox.handler());
  };
  auto message_of = [&](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const ChannelError& e) {
      return e.what();
    }
    return "(no error)";
  };
  std::string file = ::testing::TempDir() + unique_name("plain.file");
  FILE* fp = std::fopen(file.c_str(), "w");
  ASSERT_NE(fp, nullptr);
  std::fputs("data\n", fp);
  std::fclose(fp);
  EXPECT_THAT(message_of([&] { serve(file); }), HasSubstr("is not a socket"));
  struct stat st {};
  EXPECT_EQ(::stat(file.c_str(), &st), 0) << "the file was deleted";
  ::unlink(file.c_str());

  std::string live = ::testing::TempDir() + unique_name("live.sock");
  auto first = serve(live);
  EXPECT_THAT(message_of([&] { serve(live); }), HasSubstr("already in use"));
  auto s = Sender::connect(io, first->bound_addr(), opts(), nullptr);  // the first still serves
  s->send(Message{{bytes("still mine")}});
  ASSERT_TRUE(inbox.wait_for_count(1, 20s));
  EXPECT_EQ(text(inbox.take(0).parts[0]), "still mine");

  std::string stale = ::testing::TempDir() + unique_name("stale.sock");
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, stale.c_str(), sizeof sa.sun_path - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa), 0);
  ::close(fd);  // bound, never listened, closed: a stale socket file
  EXPECT_NO_THROW(serve(stale));
}

TEST(Channel, MultipartLargeMessageArrivesIntact) {
  IoRuntime io;
  Inbox inbox;
  auto l = Listener::serve(io, ChannelAddr::parse("tcp://127.0.0.1:0"), opts(), inbox.handler());
  auto s = Sender::connect(io, l->bound_addr(), opts(), nullptr);
  Bytes big(8u << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::byte>(i * 131 + 7);
  s->send(Message{{bytes("head"), big, Bytes{}}});
  ASSERT_TRUE(inbox.wait_for_count(1, 20s));
  auto m = inbox.take(0);
  ASSERT_EQ(m.parts.size(), 3u);
  EXPECT_EQ(text(m.parts[0]), "head");
  EXPECT_TRUE(m.parts[1] == big);
  EXPECT_TRUE(m.parts[2].empty());
}

TEST(Channel, SharedPartsArriveAfterOwnedPartsAndAreReleasedOnceAcknowledged) {
  IoRuntime io;
  for (std::string addr : {std::string("tcp://127.0.0.1:0"), "inproc://" + unique_name("s")}) {
    Inbox inbox;
    auto l = Listener::serve(io, ChannelAddr::parse(addr), opts(), inbox.handler());
    auto s = Sender::connect(io, l->bound_addr(), opts(), nullptr);
    auto payload = std::make_shared<const Bytes>(Bytes(3u << 20, std::byte{0x5a}));
    // Borrowed memory: a region of a buffer the channel does not own, kept valid by a lease.
    std::vector<std::byte> region(1u << 20);
    for (size_t i = 0; i < region.size(); ++i) region[i] = static_cast<std::byte>(i * 7);
    auto lease = std::make_shared<int>(0);
    for (int i = 0; i < 4; ++i) {
      s->send(Message{{bytes("m" + std::to_string(i))},
                      {SharedPart(payload), SharedPart(std::shared_ptr<const Bytes>()),
                       SharedPart(lease, std::span<const std::byte>(region).subspan(i))}});
    }
    ASSERT_TRUE(inbox.wait_for_count(4, 20s)) << addr;
    for (size_t i = 0; i < 4; ++i) {
      auto m = inbox.take(i);
      ASSERT_EQ(m.parts.size(), 4u);
      EXPECT_EQ(text(m.parts[0]), "m" + std::to_string(i));
      EXPECT_TRUE(m.parts[1] == *payload);
      EXPECT_TRUE(m.parts[2].empty());  // a null shared part arrives as an empty part
      EXPECT_TRUE(std::equal(m.parts[3].begin(), m.parts[3].end(),
                             region.begin() + static_cast<long>(i), region.end()));
    }
    // The sender holds the shared buffer and the lease only until the receiver acknowledged them.
    ASSERT_TRUE(monarch::channel::testing::wait_until([&] { return s->pending() == 0; }, 10s));
    EXPECT_EQ(payload.use_count(), 1) << addr;
    EXPECT_EQ(lease.use_count(), 1) << addr;
  }
}

TEST(Channel, OversizeSendIsAnErrorAtTheSenderAndTheLinkSurvives) {
  IoRuntime io;
  Inbox inbox;
  ChannelOptions o = opts();
  o.max_frame_bytes = 1024;
  auto l =
      Listener::serve(io, ChannelAddr::parse("unix://@" + unique_name("o")), o, inbox.handler());
  auto s = Sender::connect(io, l->bound_addr(), o, nullptr);
  s->send(Message{{bytes("before")}});
  try {
    s->send(Message{{Bytes(2000)}});
    FAIL() << "oversize send accepted";
  } catch (const ChannelError& e) {
    EXPECT_THAT(e.what(), HasSubstr("2000 bytes exceeds max_frame_bytes 1024"));
  }
  s->send(Message{{bytes("after")}});
  ASSERT_TRUE(inbox.wait_for_count(2, 10s));
  EXPECT_THAT(inbox.texts(), ::testing::ElementsAre("before", "after"));
  EXPECT_FALSE(s->closed());
}

TEST(Channel, TcpListenerWithoutSecretRefusesToStart) {
  IoRuntime io;
  Inbox inbox;
  ::unsetenv("MONARCH_SECRET");
  ::unsetenv("MONARCH_SECRET_FILE");
  try {
    Listener::serve(io, ChannelAddr::parse("tcp://127.0.0.1:0"), ChannelOptions{}, inbox.handler());
    FAIL();
  } catch (const ChannelError& e) {
    EXPECT_THAT(e.what(), HasSubstr("shared secret"));
  }
}

// A secret file that is a directory was read as nothing and called empty.
TEST(Channel, ASecretFileThatCannotBeUsedIsNamedWithWhy) {
  const std::string dir = ::testing::TempDir();
  auto error_of = [](const std::string& path) {
    try {
      (void)read_secret_file(path, "--secret-file");
    } catch (const ChannelError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of(dir), "--secret-file '" + dir + "' is a directory");
  EXPECT_THAT(error_of(dir + "/absent-secret"), HasSubstr("No such file or directory"));
  const std::string empty = dir + "/empty-secret", ok = dir + "/ok-secret";
  std::ofstream(empty) << "\n";
  std::ofstream(ok) << "s3cret\r\n";
  EXPECT_EQ(error_of(empty), "--secret-file '" + empty + "' is empty");
  EXPECT_EQ(read_secret_file(ok, "x"), "s3cret");
  ::setenv("MONARCH_SECRET_FILE", dir.c_str(), 1);
  ::unsetenv("MONARCH_SECRET");
  try {
    (void)job_secret(ChannelOptions{});
    ADD_FAILURE() << "a directory was taken as the secret";
  } catch (const ChannelError& e) {
    EXPECT_THAT(e.what(), HasSubstr("MONARCH_SECRET_FILE '" + dir + "' is a directory"));
  }
  ::unsetenv("MONARCH_SECRET_FILE");
}

TEST(Channel, WrongSecretIsRefusedAndOtherPeersKeepWorking) {  // CH-5
  IoRuntime io;
  Inbox inbox;
  auto l = Listener::serve(io, ChannelAddr::parse("tcp://127.0.0.1:0"), opts(), inbox.handler());
  ChannelOptions bad = opts();
  bad.secret = "wrong";
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> reasons;
  auto intruder = Sender::connect(io, l->bound_addr(), bad, [&](Message&&, const std::string& why) {
    std::lock_guard lock(mu);
    reasons.push_back(why);
    cv.notify_all();
  });
  intruder->send(Message{{bytes("let me in")}});
  auto good = Sender::connect(io, l->bound_addr(), opts(), nullptr);
  good->send(Message{{bytes("hello")}});
  ASSERT_TRUE(inbox.wait_for_count(1, 10s));
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 10s, [&] { return !reasons.empty(); }));
    EXPECT_THAT(reasons[0], HasSubstr("shared secret mismatch"));
  }
  EXPECT_TRUE(intruder->closed());
  EXPECT_GE(l->rejected_connections(), 1u);
  EXPECT_THAT(inbox.texts(), ::testing::ElementsAre("hello"));
}

// Writes raw bytes to a listener, as a broken or hostile peer would.
void raw_send(const std::string& abstract_name, const std::string& data, bool read_hello = true) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  sa.sun_path[0] = '\0';
  std::memcpy(sa.sun_path + 1, abstract_name.data(), abstract_name.size());
  socklen_t len =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + abstract_name.size());
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), len), 0);
  if (read_hello) {
    char buf[256];
    ASSERT_GT(::read(fd, buf, sizeof buf), 0);  // the listener's Hello
  }
  ASSERT_EQ(::write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
  ::shutdown(fd, SHUT_WR);
  char c;
  while (::read(fd, &c, 1) > 0) {
  }  // until the listener drops us
  ::close(fd);
}

TEST(Channel, GarbageTruncatedAndOversizeFramesDropOnlyThatConnection) {  // CH-6
  IoRuntime io;
  Inbox inbox;
  std::string name = unique_name("g");
  ChannelOptions o = opts();
  o.max_frame_bytes = 4096;
  auto l = Listener::serve(io, ChannelAddr::parse("unix://@" + name), o, inbox.handler());
  auto good = Sender::connect(io, l->bound_addr(), o, nullptr);
  good->send(Message{{bytes("one")}});
  ASSERT_TRUE(inbox.wait_for_count(1, 10s));

  raw_send(name, std::string(100, 'A'));  // bad magic
  std::string header(40, '\0');
  raw_send(name, header.substr(0, 17));  // truncated, then EOF
  // A header announcing a body far past max_frame_bytes (magic/version/kind from a real frame).
  auto frame = monarch::channel::testing::auth_frame_with_body_len(1u << 30);
  raw_send(name, frame);
  raw_send(name, "", false);  // connect and hang up at once

  good->send(Message{{bytes("two")}});
  ASSERT_TRUE(inbox.wait_for_count(2, 10s));
  EXPECT_THAT(inbox.texts(), ::testing::ElementsAre("one", "two"));
  EXPECT_GE(l->rejected_connections(), 2u);  // bad magic, oversize (EOFs are not protocol errors)
}

TEST(Channel, ReconnectsAndResendsToANewListenerOnTheSameAddress) {  // CH-2, CH-3
  IoRuntime io;
  std::string addr = "unix://@" + unique_name("r");
  Inbox first;
  auto l1 = Listener::serve(io, ChannelAddr::parse(addr), opts(), first.handler());
  std::mutex mu;
  std::vector<std::string> failed;
  auto s = Sender::connect(io, ChannelAddr::parse(addr), opts(),
                           [&](Message&& m, const std::string& why) {
                             std::lock_guard lock(mu);
                             failed.push_back(text(m.parts[0]) + ": " + why);
                           });
  for (int i = 0; i < 10; ++i) s->send(Message{{bytes(std::to_string(i))}});
  ASSERT_TRUE(first.wait_for_count(10, 10s));
  ASSERT_TRUE(monarch::channel::testing::wait_until([&] { return s->pending() == 0; }, 10s));
  l1.reset();  // the listener goes away; the sender reconnects with backoff
  Inbox second;
  for (int i = 10; i < 20; ++i) s->send(Message{{bytes(std::to_string(i))}});
  auto l2 = Listener::serve(io, ChannelAddr::parse(addr), opts(), second.handler());
  ASSERT_TRUE(monarch::channel::testing::wait_until([&] { return s->pending() == 0; }, 10s));
  // Everything sent while the listener was down is either delivered to the new one, in order,
  // or (if it was written to the old one and never acknowledged) returned: never both, never lost.
  auto got = second.texts();
  std::lock_guard lock(mu);
  EXPECT_EQ(got.size() + failed.size(), 10u);
  for (size_t i = 1; i < got.size(); ++i) EXPECT_LT(std::stoi(got[i - 1]), std::stoi(got[i]));
}

// A Listener that shuts down acknowledges what it delivered first, so its senders neither wait
// for an Ack that never comes nor report delivered messages as undelivered. The listener's
// batched Ack is pushed out of reach (ack_every, ack_interval), so only that last Ack can clear
// pending(): without it the senders hold 3 unacknowledged messages until the deadline.
TEST(Channel, AListenerThatShutsDownAcknowledgesWhatItDelivered) {  // CH-2
  IoRuntime io;
  ChannelOptions lo = opts();
  lo.ack_every = 1u << 30;
  lo.ack_interval = 60s;
  for (const std::string& addr :
       {"unix://@" + unique_name("last-ack"), std::string("tcp://127.0.0.1:0")}) {
    SCOPED_TRACE(addr);
    Inbox inbox;
    auto l = Listener::serve(io, ChannelAddr::parse(addr), lo, inbox.handler());
    std::atomic<int> failures{0};
    auto s = Sender::connect(io, l->bound_addr(), opts(),
                             [&](Message&&, const std::string&) { ++failures; });
    for (int i = 0; i < 3; ++i) s->send(Message{{bytes(std::to_string(i))}});
    ASSERT_TRUE(inbox.wait_for_count(3, 10s)) << "got " << inbox.count();
    EXPECT_EQ(s->pending(), 3u);  // delivered, not yet acknowledged
    l.reset();
    EXPECT_TRUE(monarch::channel::testing::wait_until([&] { return s->pending() == 0; }, 10s))
        << s->pending() << " message(s) still unacknowledged after the listener shut down";
    EXPECT_EQ(failures.load(), 0);
    EXPECT_EQ(inbox.texts(), (std::vector<std::string>{"0", "1", "2"}));
  }
}

// ChannelOptions::close_if_refused (a link to a peer known to have exited): the first refused
// connection closes the link and returns everything sent, naming the refusal, instead of
// retrying until delivery_timeout. A peer that is listening is reached as usual.
TEST(Channel, ALinkToAPeerKnownToHaveExitedClosesAtItsFirstRefusal) {
  IoRuntime io;
  ChannelOptions o = opts();
  o.delivery_timeout = 60s;  // waiting for it would outlast the deadline below
  o.close_if_refused = true;
  std::string tcp;  // a port whose listener is gone
  {
    Inbox none;
    auto l = Listener::serve(io, ChannelAddr::parse("tcp://127.0.0.1:0"), opts(), none.handler());
    tcp = "tcp://127.0.0.1:" + std::to_string(l->bound_addr().port);
  }
  const std::string path = "unix://" + ::testing::TempDir() + unique_name("gone.sock");
  for (const std::string& addr : {"unix://@" + unique_name("gone"), path, tcp}) {
    SCOPED_TRACE(addr);
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::string> failed;
    std::string closed_why;
    auto s =
        Sender::connect(io, ChannelAddr::parse(addr), o, [&](Message&& m, const std::string& why) {
          std::lock_guard lock(mu);
          failed.push_back(text(m.parts[0]) + ": " + why);
          cv.notify_all();
        });
    s->on_close([&](const std::string& why) {
      std::lock_guard lock(mu);
      closed_why = why;
      cv.notify_all();
    });
    s->send(Message{{bytes("one")}});
    s->send(Message{{bytes("two")}});
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, 20s, [&] { return failed.size() == 2 && !closed_why.empty(); }))
        << failed.size() << " returned";
    EXPECT_THAT(failed[0], HasSubstr("one: peer "));
    EXPECT_THAT(failed[0], HasSubstr(" has exited ("));
    EXPECT_THAT(failed[1], HasSubstr("two: peer "));
    EXPECT_THAT(closed_why, HasSubstr("has exited"));
    EXPECT_TRUE(s->closed());
  }
  Inbox inbox;
  const std::string there = "unix://@" + unique_name("there");
  auto l = Listener::serve(io, ChannelAddr::parse(there), opts(), inbox.handler());
  std::atomic<int> failures{0};
  auto s = Sender::connect(io, ChannelAddr::parse(there), o,
                           [&](Message&&, const std::string&) { ++failures; });
  for (int i = 0; i < 3; ++i) s->send(Message{{bytes(std::to_string(i))}});
  ASSERT_TRUE(inbox.wait_for_count(3, 10s));
  EXPECT_THAT(inbox.texts(), ::testing::ElementsAre("0", "1", "2"));
  EXPECT_EQ(failures.load(), 0);
  EXPECT_FALSE(s->closed());
}

}  // namespace
