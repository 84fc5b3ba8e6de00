// actcap as a library: load a model, split it over three devices for this run, capture two
// patterns, export the captures and verify the folder. `make test` builds it twice, in the tree
// and against the installed package (examples/CMakeLists.txt, find_package(actcap)), and runs it.
#include <actcap/actcap.h>

#include <iostream>

int main(int argc, char** argv) {
  const std::string out = argc > 1 ? argv[1] : "embed-out";
  try {
    auto model = actcap::Model::load("demo");  // or a Hugging Face checkpoint directory
    const actcap::Batch batch =
        actcap::Batch::from_sequences({{72, 101, 108, 108, 111}, {119, 111, 114}},
                                      model->config().vocab_size, model->config().max_positions());
    const actcap::CaptureOptions capture{{"transformer.h.*", "transformer.h.1.mlp:input"}};

    actcap::SplitOptions split;  // three virtual devices, balanced; budgets would go here too
    for (int i = 0; i < 3; ++i) split.devices.push_back(actcap::DeviceId::virtual_cpu(i));
    split.strategy = actcap::PlanStrategy::kBalanced;
    const actcap::DevicePlan plan = actcap::split_model(
        *model, split, batch.size(), batch.max_len(), actcap::plan_capture(*model, capture));
    std::cout << plan.table();

    actcap::SafeCapturer capturer(*model, capture);
    capturer.run(batch);
    for (const actcap::PointInfo& p : capturer.plan())
      std::cout << p.name << ": " << capturer.get(p.name).sizes() << "\n";  // verified reads

    actcap::prepare_output_dir(out, /*overwrite=*/true);
    actcap::export_run(out, capturer, *model);
    const actcap::VerifyReport report = actcap::verify_output(out);
    for (const actcap::VerifyIssue& i : report.issues)
      std::cout << "BAD " << i.file << " " << i.tensor << ": " << i.problem << "\n";
    std::cout << (report.ok() ? "verified " : "FAILED ") << report.tensors << " tensors in "
              << report.shards << " shard(s) in " << out << "\n";
    return report.ok() ? 0 : 1;
  } catch (const actcap::Error& e) {
    std::cerr << "embed: " << e.what() << "\n";
    return e.exit_code();
  }
}
