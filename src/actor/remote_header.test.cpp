// RemoteHeader on the wire: the mesh point of a remotely spawned member (Context::actor_rank in
// the mesh layer) travels in Spawn headers only, the caller's frame limit in requests only; every
// other kind keeps its bytes.
#include <gtest/gtest.h>

#include <tuple>

#include "monarch/actor/remote.hpp"

namespace {

using monarch::detail::RemoteHeader;
using monarch::detail::RemoteKind;

RemoteHeader sample(RemoteKind kind) {
  RemoteHeader h;
  h.kind = kind;
  h.dest = monarch::ActorId{"unix://@peer", "worker", 42};
  h.endpoint = "step";
  h.reply_proc = "unix://@client";
  h.request_id = 7;
  h.message_rank = 3;
  h.spawn_labels = {"hosts", "gpus"};
  h.spawn_sizes = {2, 4};
  return h;
}

TEST(RemoteHeader, OnlySpawnCarriesTheMeshExtent) {
  for (RemoteKind kind :
       {RemoteKind::Call, RemoteKind::Send, RemoteKind::Reply, RemoteKind::Bounce,
        RemoteKind::Lookup, RemoteKind::PortSend, RemoteKind::Supervise, RemoteKind::Stop}) {
    RemoteHeader h = sample(kind);
    // The bytes of the fields every header had before the Spawn-only ones, nothing more.
    auto before = monarch::wire::encode(std::make_tuple(
        h.kind, h.dest, h.endpoint, h.reply_proc, h.request_id, h.sender, h.error, h.message_rank));
    // Requests that want a reply also carry the caller's frame limit (reply_limit).
    if (kind == RemoteKind::Call || kind == RemoteKind::Lookup || kind == RemoteKind::Stop) {
      before = monarch::wire::encode(std::make_tuple(h.kind, h.dest, h.endpoint, h.reply_proc,
                                                     h.request_id, h.sender, h.error,
                                                     h.message_rank, h.reply_limit));
    }
    auto bytes = monarch::wire::encode(h);
    EXPECT_EQ(bytes, before) << "kind " << static_cast<int>(kind);
    auto back = monarch::wire::decode<RemoteHeader>(bytes);
    EXPECT_TRUE(back.spawn_labels.empty());
    EXPECT_TRUE(back.spawn_sizes.empty());
    EXPECT_EQ(back.message_rank, 3u);
  }
  RemoteHeader spawn = sample(RemoteKind::Spawn);
  auto back = monarch::wire::decode<RemoteHeader>(monarch::wire::encode(spawn));
  EXPECT_EQ(back.kind, RemoteKind::Spawn);
  EXPECT_EQ(back.message_rank, 3u);
  EXPECT_EQ(back.spawn_labels, spawn.spawn_labels);
  EXPECT_EQ(back.spawn_sizes, spawn.spawn_sizes);
}

}  // namespace
