// File output shared by every tool and writer: nothing half-written is ever left behind (a temporary name, then rename).
#pragma once

#include <string>
#include <string_view>

#include "ir/status.h"

namespace tpc {

Status writeFileAtomically(const std::string& path, std::string_view contents);

}  // namespace tpc
