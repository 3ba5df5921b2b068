// qkmla: the command-line front end. Exit codes: 0 ok/pass, 1 a verdict failed, 2 bad usage or
// bad input (with a message naming the field, file or tensor).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <thread>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <vector>

#include "cli/case_flags.hpp"
#include "cli/commands.hpp"
#include "core/config.hpp"
#include "harness/resources.hpp"
#include "io/safetensors.hpp"

using namespace qkmla;

int main(int argc, char** argv) {
#ifdef __GLIBC__
  // glibc keeps up to 8 malloc arenas per core, and each short-lived helper thread's arena keeps
  // the exact-product blocks it freed: 681 MB peak at 32k tokens (qkmla reference), 445 MB with one
  // arena per core, no slower.
  mallopt(M_ARENA_MAX, int(std::max(2u, std::thread::hardware_concurrency())));
#endif
  CLI::App app{
      "qkmla: numerical verification of QK-Normed MLA (explicit vs absorbed, every precision)"};
  app.require_subcommand(1);
  std::string command_line;
  for (int i = 0; i < argc; ++i) command_line += (i ? " " : "") + std::string(argv[i]);
  std::vector<std::pair<CLI::App*, cli::Runner>> commands;
  auto add = [&](cli::Runner r) {
    commands.emplace_back(app.get_subcommands({}).back(), std::move(r));
  };
  add(cli::add_presets(app));
  add(cli::add_report(app, command_line));
  add(cli::add_gate(app, command_line));
  add(cli::add_mutants(app, command_line));
  add(cli::add_golden(app, command_line));
  add(cli::add_audit(app, command_line));
  add(cli::add_certify(app, command_line));
  add(cli::add_reference(app, command_line));
  add(cli::add_converge(app, command_line));
  add(cli::add_bench(app, command_line));
  try {
    if (argc > 0) app.name(argv[0]);  // as app.parse(argc, argv) would: usage lines name it
    cli::parse_args(app, std::vector<std::string>(argv + std::min(argc, 1), argv + argc));
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "qkmla: " << e.what() << "\n(run 'qkmla --help' or 'qkmla <command> --help')\n";
    return 2;
  }
  try {
    for (auto& [cmd, run] : commands)
      if (cmd->parsed()) return run();
  } catch (const ConfigError& e) {
    std::cerr << "qkmla: invalid configuration: " << e.what() << "\n";
    return 2;
  } catch (const InputError& e) {
    std::cerr << "qkmla: bad input: " << e.what() << "\n";
    return 2;
  } catch (const ResourceError& e) {
    std::cerr << "qkmla: too big: " << e.what() << "\n";
    return 2;
  } catch (const std::invalid_argument& e) {  // e.g. a shape the GPU kernels do not support
    std::cerr << "qkmla: " << e.what() << "\n";
    return 2;
  } catch (const std::runtime_error& e) {  // a CUDA call that failed
    std::cerr << "qkmla: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {  // never a crash: say what broke
    std::cerr << "qkmla: internal error: " << e.what() << "\n";
    return 2;
  }
  return 2;
}
