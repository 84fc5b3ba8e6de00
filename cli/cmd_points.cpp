// actcap points: every hook point with its per-token shape and dtype.
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "actcap/capture.h"
#include "actcap/error.h"
#include "actcap/safetensors.h"
#include "common.h"

namespace actcap::cli {

namespace {

// The flags of `actcap points`.
struct PointsCommand {
  std::string model = "demo";
  std::string compute_dtype = "f32";
  bool json = false;
};

// Lists every hook point of MODEL with its per-token shape and dtype.
int run_points_command(const PointsCommand& o) {
  LoadOptions load;
  load.compute_dtype = parse_compute_dtype(o.compute_dtype);
  auto model = Model::load(o.model, load);
  const auto points = model->points();
  if (o.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const PointInfo& p : points)
      arr.push_back(
          {{"name", p.name}, {"shape", p.shape}, {"dtype", safetensors_dtype_name(p.dtype)}});
    nlohmann::json out = {{"model", o.model},
                          {"model_type", model->config().model_type},
                          {"compute_dtype", compute_dtype_name(model->compute_dtype())},
                          {"points", arr}};
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  size_t width = 5;
  for (const PointInfo& p : points) width = std::max(width, p.name.size());
  std::cout << std::left << std::setw(width + 2) << "point" << std::setw(12) << "per-token"
            << "dtype\n";
  for (const PointInfo& p : points) {
    // Attention patterns: [heads, keys], keys being the run's key length (docs/hook-points.md).
    const std::string shape =
        is_attention_point(p.name) ? concat("[", p.shape.at(0), ", keys]") : shape_string(p.shape);
    std::cout << std::left << std::setw(width + 2) << p.name << std::setw(12) << shape
              << safetensors_dtype_name(p.dtype) << "\n";
  }
  std::cout << points.size() << " hook points (" << model->config().model_type << ", "
            << model->config().num_layers() << " layers)\n";
  return 0;
}

}  // namespace

Command add_points(CLI::App& app) {
  auto* sub =
      app.add_subcommand("points", "List every hook point of MODEL (per-token shape, dtype)");
  auto o = std::make_shared<PointsCommand>();
  sub->add_option("MODEL", o->model, "Checkpoint directory or 'demo'");
  sub->add_option("--compute-dtype", o->compute_dtype,
                  "The dtype the points have under run/extract --compute-dtype: f32 (default) | "
                  "bf16 | f16");
  sub->add_flag("--json", o->json, "Machine-readable output");
  return {sub, [o] { return run_points_command(*o); }};
}

}  // namespace actcap::cli
