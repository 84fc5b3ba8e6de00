// actcap merge: assemble (or repair) the manifest.json of a ranked extract from its ranks'
// manifests (docs/scale.md).
#include <iostream>

#include "actcap/error.h"
#include "actcap/extract.h"
#include "common.h"

namespace actcap::cli {

Command add_merge(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "merge", "Assemble one manifest.json from the rank manifests of a ranked extract");
  struct Options {
    std::string dir;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  sub->add_option("DIR", o->dir, "The extract's output folder")->required();
  sub->add_flag("--json", o->json, "Machine-readable summary");
  return {sub, [o] {
            const MergeReport r = merge_ranks(o->dir, {}, 0, export_faults_from_env());
            if (!r.assembled)
              throw RunError(concat("cannot assemble ", o->dir, "/manifest.json: ",
                                    [&] {
                                      std::string all;
                                      for (const std::string& w : r.waiting)
                                        all += (all.empty() ? "" : "; ") + w;
                                      return all;
                                    }()),
                             {"resume"});
            if (o->json) {
              std::cout << nlohmann::json({{"manifest", r.manifest},
                                           {"world_size", r.world_size},
                                           {"shards", r.shards},
                                           {"rows", r.rows}})
                               .dump(2)
                        << "\n";
            } else {
              std::cout << "assembled " << r.manifest << " from " << r.world_size
                        << " ranks: " << r.shards << " shards, " << r.rows << " rows\n";
            }
            return 0;
          }};
}

}  // namespace actcap::cli
