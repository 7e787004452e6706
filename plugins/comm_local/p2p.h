#pragma once
// Point to point through the group's mailboxes: eager sends, so a send never
// waits for its receiver, and receives that may finish after they are issued.
#include <memory>
#include <string>

#include "group.h"

namespace sp_local {

int do_send(Comm* c, const Desc& d, std::string& msg);
void post_recv(Comm* c, const std::shared_ptr<Op>& op);
void expire_recv(Op* op);

}  // namespace sp_local
