// How an audit is shown: a table (text or Markdown), JSON, JUnit.
#pragma once
#include <string>

#include "harness/audit.hpp"

namespace qkmla {

std::string audit_text(const AuditResult& r, bool markdown);
std::string audit_json(const AuditResult& r);
std::string audit_junit(const AuditResult& r);

}  // namespace qkmla
