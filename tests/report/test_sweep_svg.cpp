// bench/sweep_bench.h: the sweep chart drawn through report/chart.h still shows what it showed —
// one numbered point per placement (device memory against throughput, both axes from zero, the
// memory axis in byte sizes) and a legend line per placement with its host and NVMe bytes — and
// re-renders the sweep saved in bench/results.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "bench/sweep_bench.h"
#include "core/size.h"
#include "tests/report/svg_check.h"

using namespace strata;

namespace {

nlohmann::json row(const std::string& placement, double tps, uint64_t device, uint64_t host,
                   uint64_t pinned, uint64_t nvme) {
  return {{"placement", placement},
          {"params", "device"}, {"optimizer", "device"}, {"grads", "device"},
          {"tokens_per_s", tps}, {"step_ms", 10.0},
          {"time", {{"compute_ms", 8.0}, {"wait_io_ms", 0.0}, {"wait_comm_ms", 0.0}, {"optimizer_ms", 2.0}}},
          {"peak_bytes", {{"device", device}, {"pinned", pinned}, {"host_state", host}, {"nvme", nvme}, {"host_rss", 1}}},
          {"bytes_per_step", {{"h2d", 0.0}, {"d2h", 0.0}, {"nvme_read", 0.0}, {"nvme_write", 0.0}, {"comm", 0.0}}},
          {"io_bound_ms", 0.0}, {"bound_ms", 10.0}, {"step_over_bound", 1.0}};
}

}  // namespace

TEST(SweepSvg, NumberedPointsAndLegend) {
  nlohmann::json s = {{"ranks", 2},
                      {"rows", {row("device:device", 1000, 2 * GiB, 0, 0, 0),
                                row("host:nvme", 400, 512 * MiB, GiB, 256 * MiB, 3 * GiB),
                                row("nvme:nvme", 400, 512 * MiB, 0, 256 * MiB, 4 * GiB)}}};  // coincides
  const std::string svg = sweep_svg(s);
  ASSERT_EQ(test::svg_problem(svg), "") << svg;
  EXPECT_NE(svg.find(">strata bench sweep: device memory against throughput (2 ranks)</text>"), std::string::npos);
  EXPECT_NE(svg.find(">tokens/s (all ranks)</text>"), std::string::npos);
  EXPECT_NE(svg.find(">peak device bytes per rank</text>"), std::string::npos);
  // One marker per placement (plus one legend sample each), numbered 1..3; no lines between them.
  EXPECT_EQ(test::count(svg, "<circle"), 6);
  EXPECT_TRUE(test::polylines(svg).empty());
  for (const char* n : {">1</text>", ">2</text>", ">3</text>"}) EXPECT_NE(svg.find(n), std::string::npos) << n;
  // The coincident points' numbers are lifted apart.
  std::smatch m2, m3;
  ASSERT_TRUE(std::regex_search(svg, m2, std::regex("y=\"([0-9.]+)\" fill=\"#d62728\" font-weight=\"bold\"")));
  ASSERT_TRUE(std::regex_search(svg, m3, std::regex("y=\"([0-9.]+)\" fill=\"#2ca02c\" font-weight=\"bold\"")));
  EXPECT_NE(m2[1].str(), m3[1].str());
  EXPECT_NE(svg.find(">1  device:device (params:optimizer): 1000 tok/s, device 2G, host 0, nvme 0</text>"),
            std::string::npos);
  EXPECT_NE(svg.find(">2  host:nvme (params:optimizer): 400 tok/s, device 512M, host 1.25G, nvme 3G</text>"),
            std::string::npos);
  // Both axes from zero; memory ticks in byte sizes, past the largest point (headroom).
  EXPECT_NE(svg.find("text-anchor=\"end\">0</text>"), std::string::npos);
  EXPECT_NE(svg.find("text-anchor=\"end\">2G</text>"), std::string::npos);
  EXPECT_NE(svg.find("text-anchor=\"end\">2.5G</text>"), std::string::npos);
  EXPECT_NE(svg.find("text-anchor=\"middle\">0</text>"), std::string::npos);
}

TEST(SweepSvg, SinglePlacementAtZero) {  // nothing to divide by
  nlohmann::json s = {{"ranks", 1}, {"rows", {row("device:device", 0, 0, 0, 0, 0)}}};
  const std::string svg = sweep_svg(s);
  EXPECT_EQ(test::svg_problem(svg), "");
  EXPECT_NE(svg.find("(1 rank)"), std::string::npos);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
}

TEST(SweepSvg, RendersTheSavedSweep) {
  std::ifstream in(std::string(STRATA_SOURCE_DIR) + "/bench/results/cpu-epyc-2core-2026-11-29-sweep_1024x12-2ranks.json");
  ASSERT_TRUE(in);
  const nlohmann::json s = nlohmann::json::parse(in);
  const std::string svg = sweep_svg(s);
  EXPECT_EQ(test::svg_problem(svg), "");
  EXPECT_EQ(test::count(svg, "<circle"), 2 * int(s["rows"].size()));
  EXPECT_NE(svg.find("device:device (params:optimizer)"), std::string::npos);
  EXPECT_TRUE(sweep_csv(s).starts_with("placement,params,optimizer,grads,tokens_per_s,step_ms,"));
}

// Rows with the step model's prediction: a dashed line to a small dot at the predicted
// throughput (tokens/s × measured / predicted step), the ratio in the legend, and three CSV
// columns; rows of a sweep saved before the model leave those cells empty (above).
TEST(SweepSvg, PredictedThroughputDotAndCsvColumns) {
  nlohmann::json r = row("host:nvme", 400, 512 * MiB, GiB, 256 * MiB, 3 * GiB);
  r["predicted_step_ms"] = 8.0;  // measured 10: predicted 500 tok/s
  r["predicted_bottleneck"] = "optimizer (nvme)";
  r["measured_over_predicted"] = 1.25;
  nlohmann::json s = {{"ranks", 1}, {"rows", {r}}};
  const std::string svg = sweep_svg(s);
  ASSERT_EQ(test::svg_problem(svg), "") << svg;
  EXPECT_EQ(test::count(svg, "<circle"), 2 + 1 + 1);  // the point, the predicted line's two markers, one legend sample
  EXPECT_EQ(test::polylines(svg).size(), 1u);
  EXPECT_NE(svg.find("; predicted 500 (step 1.25x)</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find("predicted tok/s"), std::string::npos);
  const std::string csv = sweep_csv(s);
  EXPECT_NE(csv.find(",predicted_step_ms,predicted_bottleneck,measured_over_predicted,update_wait_ms,"
                     "overlap_optimizer,process_cores,steal_share\n"),
            std::string::npos) << csv;
  // Saved before update waits, the optimizer order and the CPU time were recorded: empty cells.
  EXPECT_NE(csv.find(",8.0,optimizer (nvme),1.250,,,,\n"), std::string::npos) << csv;
  r["time"]["update_wait_ms"] = 2.5;  // the passes waited for an overlapped optimizer step
  EXPECT_NE(sweep_csv({{"ranks", 1}, {"rows", {r}}}).find(",1.250,2.5,,,\n"), std::string::npos);
  r["overlap_optimizer"] = false;  // a --both-orders sweep's serial row
  EXPECT_NE(sweep_csv({{"ranks", 1}, {"rows", {r}}}).find(",1.250,2.5,false,,\n"), std::string::npos);
  r["overlap_optimizer"] = true;
  EXPECT_NE(sweep_csv({{"ranks", 1}, {"rows", {r}}}).find(",1.250,2.5,true,,\n"), std::string::npos);
  r["cpu"] = {{"process_cores", 1.5}, {"steal_share", 0.125}};  // its steps' CPU time
  EXPECT_NE(sweep_csv({{"ranks", 1}, {"rows", {r}}}).find(",2.5,true,1.5,0.125\n"), std::string::npos)
      << sweep_csv({{"ranks", 1}, {"rows", {r}}});
  r["cpu"]["steal_share"] = nullptr;  // a machine without /proc/stat
  EXPECT_NE(sweep_csv({{"ranks", 1}, {"rows", {r}}}).find(",2.5,true,1.5,\n"), std::string::npos);
}
