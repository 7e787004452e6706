#pragma once
// How the ranks of a new world find one group: by the id they were created with.
#include <cstdint>
#include <memory>
#include <string>

#include "group.h"

namespace sp_local {

int rendezvous(const std::string& id, int rank, int n, int64_t timeout_ms, std::shared_ptr<Group>& out);

}  // namespace sp_local
