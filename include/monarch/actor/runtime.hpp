// The actor runtime in one include: Proc, Actor, ActorRef, endpoints, Future, Task, ports.
#pragma once

#include "monarch/actor/actor.hpp"
#include "monarch/actor/actor_id.hpp"
#include "monarch/actor/actor_ref.hpp"
#include "monarch/actor/endpoint.hpp"
#include "monarch/actor/errors.hpp"
#include "monarch/actor/future.hpp"
#include "monarch/actor/lifecycle.hpp"
#include "monarch/actor/port.hpp"
#include "monarch/actor/proc.hpp"
#include "monarch/actor/scheduler.hpp"
#include "monarch/actor/supervision.hpp"
#include "monarch/actor/task.hpp"
