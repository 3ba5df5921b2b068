// The subcommands. Each add_* registers its flags on `app` and returns what runs it.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "gpu/qkmla_gpu.hpp"

namespace qkmla::cli {

using Runner = std::function<int()>;

Runner add_presets(CLI::App& app);
Runner add_report(CLI::App& app, const std::string& command_line);
Runner add_gate(CLI::App& app, const std::string& command_line);
Runner add_mutants(CLI::App& app, const std::string& command_line);
Runner add_golden(CLI::App& app, const std::string& command_line);
Runner add_audit(CLI::App& app, const std::string& command_line);
Runner add_certify(CLI::App& app, const std::string& command_line);
Runner add_reference(CLI::App& app, const std::string& command_line);
Runner add_converge(CLI::App& app, const std::string& command_line);
Runner add_bench(CLI::App& app, const std::string& command_line);

}  // namespace qkmla::cli
