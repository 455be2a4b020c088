// epx — the command-line tool: a thin main over the library's subcommands.
#include <cstdio>
#include <exception>

#include "commands.hpp"
#include "epx/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"epx: MoE expert-parallel dispatch and combine"};
  app.require_subcommand(1);
  epx::tools::add_replay_command(app);
  epx::tools::add_bench_command(app);
  epx::tools::add_eplb_command(app);
  epx::tools::add_sim_command(app);
  epx::tools::add_html_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const epx::Error& e) {
    std::fprintf(stderr, "epx: error (%s): %s\n", epx::to_string(e.code()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "epx: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
