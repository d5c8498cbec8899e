// Internal: factories for actors spawned in another process (Proc::spawn_remote,
// Actor::spawn_remote).
//
// A factory is keyed by a stable string, "<actor type>(<argument types>)", e.g.
// "app::Trainer(int, std::__cxx11::basic_string<char, ...>)". It is registered during static
// initialisation by RemoteFactoryRegistration<A, Args...>::registered, a template static member
// that the spawn_remote<A>(...) call site instantiates. The worker process runs the same binary as
// the client, so it holds the factory of every spawn_remote call compiled into that binary, even
// though it never executes the call itself.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

#include "monarch/actor/actor_id.hpp"
#include "monarch/actor/detail/hooks.hpp"
#include "monarch/actor/detail/unique_function.hpp"
#include "monarch/wire/serialize.hpp"

namespace monarch {
class Actor;
class Proc;
}  // namespace monarch
namespace monarch::ndslice {
class Point;
}  // namespace monarch::ndslice

namespace monarch::detail {

class Cell;

/// The type an argument of spawn_remote travels as: its decayed type, and std::string for
/// string literals / C strings (a pointer cannot cross processes).
template <class T>
struct wire_arg {
  using type = std::decay_t<T>;
};
template <class T>
requires std::is_same_v < std::decay_t<T>,
const char* > || std::is_same_v<std::decay_t<T>, char*> struct wire_arg<T> {
  using type = std::string;
};
template <class T>
using wire_arg_t = typename wire_arg<T>::type;

/// Turns the encoded constructor arguments into a factory that constructs the actor (on the
/// actor's first activation). Throws when the arguments cannot be decoded.
using RemoteFactoryFn =
    UniqueFunction<std::unique_ptr<Actor>()> (*)(const std::vector<std::byte>& args);

struct RemoteFactory {
  std::type_index type = typeid(void);
  std::string type_name;  // demangled actor type, for reports
  RemoteFactoryFn decode = nullptr;
};

/// Registers a factory under `key` (static initialisation; thread-safe). Returns true.
bool add_remote_factory(const std::string& key, RemoteFactory factory);
/// The factory registered under `key`, or nullptr.
const RemoteFactory* find_remote_factory(const std::string& key);

/// Sends the Spawn message for a new actor in the Proc at `proc_addr` and returns its id at once
/// (the caller picks the uid, see Proc::spawn_remote). `owner` is the spawning actor (nullptr:
/// `proc`'s client). `mesh_point` (may be null) travels in the Spawn message and becomes the new
/// actor's Cell::mesh_point. Throws UsageError (bad address, `proc` does not listen) or
/// SupervisionError (that Proc was declared failed).
ActorId remote_spawn_id(Proc& proc, Cell* owner, const std::string& proc_addr, std::string name,
                        const std::string& key, std::vector<std::byte> args,
                        const ndslice::Point* mesh_point);

template <class A>
void register_endpoints();

template <class A, class... Args>
struct RemoteFactoryRegistration {
  static std::string key() {
    std::string k = demangle(typeid(A).name()) + "(";
    bool first = true;
    ((k += (first ? "" : ", ") + demangle(typeid(Args).name()), first = false), ...);
    return k + ")";
  }
  static UniqueFunction<std::unique_ptr<Actor>()> decode(const std::vector<std::byte>& bytes) {
    register_endpoints<A>();
    auto args = wire::decode<std::tuple<Args...>>(bytes);
    return [args = std::move(args)]() mutable -> std::unique_ptr<Actor> {
      return std::apply([](Args&... a) { return std::make_unique<A>(std::move(a)...); }, args);
    };
  }
  static const bool registered;
};

template <class A, class... Args>
const bool RemoteFactoryRegistration<A, Args...>::registered =
    add_remote_factory(RemoteFactoryRegistration<A, Args...>::key(),
                       RemoteFactory{typeid(A), demangle(typeid(A).name()),
                                     &RemoteFactoryRegistration<A, Args...>::decode});

/// Shared body of Proc::spawn_remote(_member) and Actor::spawn_remote (`mesh_point`: see
/// remote_spawn_id).
template <class A, class... Args>
ActorId spawn_remote_id(Proc& proc, Cell* owner, const ndslice::Point* mesh_point,
                        const std::string& proc_addr, std::string name, Args&&... args) {
  using Reg = RemoteFactoryRegistration<A, wire_arg_t<Args>...>;
  using Tuple = std::tuple<wire_arg_t<Args>...>;
  static_assert(wire::is_serializable_v<Tuple>,
                "spawn_remote<A>(addr, name, args...): every constructor argument must be "
                "serialisable with cereal (they travel to the other process)");
  static_assert(
      std::is_constructible_v<A, wire_arg_t<Args>&&...>,
      "spawn_remote<A>(addr, name, args...): A has no constructor taking these arguments");
  // Reading `registered` odr-uses it, so every binary containing this call registers the factory
  // at static initialisation, including a worker that never makes the call.
  if (!Reg::registered) throw Error("spawn_remote: factory registration failed");
  register_endpoints<A>();
  Tuple t(std::forward<Args>(args)...);
  return remote_spawn_id(proc, owner, proc_addr, std::move(name), Reg::key(), wire::encode(t),
                         mesh_point);
}

}  // namespace monarch::detail
