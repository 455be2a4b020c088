// The data-plane options on the command line (`epx bench`, `epx replay`): CLI11 flags over
// the text forms of epx/bench/dataplane_options.hpp.
#include "dataplane_cli.hpp"

#include "epx/bench/dataplane_options.hpp"
#include "epx/error.hpp"

namespace epx::tools {

void add_dataplane_options(CLI::App* sub, DataPlaneOptions& d) {
  struct Flag {
    const char* name;
    const char* type;
    const char* help;
  };
  static const Flag flags[] = {
      {"topology", "SPEC", "where each rank sits: builtin:flat | builtin:servers:N | builtin:supernode128 | a JSON file"},
      {"schedule", "KIND", "order of destinations: flat | rotated | grouped:W | hierarchical"},
      {"queues", "N", "transport queues per worker: 1 | 2 | 4"},
      {"queue-split", "SPLIT", "channels over queues: rr | bytes | a:b[:..] (one weight per queue, e.g. 3:1)"},
      {"aggregate", "BYTES", "merge consecutive rows to the same peer into puts of up to BYTES (K/M/G suffixes; 0 = off)"},
      {"protocol", "KIND", "completion: explicit (quiet + signal) | tail (ordered signal per queue) | flag (data-as-flag)"},
      {"send-policy", "POLICY",
       "dispatch send order: auto (from P, row size, transport put costs) | whole (destination by destination) | "
       "block:BYTES (tokens in blocks of BYTES of rows, each block to every destination)"},
      {"combine-order", "ORDER",
       "combine's additions (docs/spec.md §4): flat | node-first (hierarchical: sums inside each server at the relay, "
       "one reply per token and server pair)"},
      {"combine-replies", "KIND", "what an expanded combine sends back: partials (one per token and rank, summed at the expert) | "
                                   "selections (one per token and expert, DeepEP's low-latency combine; the source forms the "
                                   "partials: the same bits)"},
      {"replies-first-max", "BYTES", "with an output pool, a combine right after its dispatch pushes its replies before the header "
                                     "exchange (one synchronisation) when every rank's dispatch output is at most BYTES, else it "
                                     "exchanges first and pulls where it can (0 = never)"},
      {"stream-min-call", "BYTES", "puts and copies use streaming stores only in calls where this rank writes at least BYTES "
                                   "(smaller calls write through the cache, where the readers find the rows; 0 = always stream)"},
      {"relay-chunk", "BYTES", "hierarchical combine: members send their replies chunk by chunk to every relay, which sums or "
                               "forwards a chunk once every member signalled it (the stages overlap); auto (chunked only where "
                               "the transport states its put costs: the simulator) | BYTES of relayed rows | 0 = the serial relay"},
      {"path", "NAME", "the base data path by name: auto (the one the other options take) | direct | relay | ring | a path "
                       "registered from outside (docs/engine.md); it must take the other options"},
  };
  for (const Flag& f : flags) {
    const std::string name = f.name;
    sub->add_option_function<std::string>(
           "--" + name,
           [&d, name](const std::string& value) {
             try {
               set_dataplane_option(d, name, value);
             } catch (const Error& e) {
               throw CLI::ValidationError(e.what());  // already "--name: why"
             }
           },
           f.help)
        ->type_name(f.type)
        ->default_str(dataplane_option_value(d, name));
  }
}

}  // namespace epx::tools
