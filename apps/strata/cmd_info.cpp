// apps/strata/cmd_info.cpp — `strata info`: build options, CPU ISA, threads, AdamW path,
// io_uring availability and registration, staging pages, CUDA devices. --json for one JSON object.
#include <cstdio>

#include <nlohmann/json.hpp>
#include <tbb/info.h>

#include "apps/strata/commands.h"
#include "build_info.h"
#include "core/cpu.h"
#include "core/size.h"
#include "engine/info.h"
#include "kernels/device.h"
#include "optimizer/adamw.h"

namespace strata::app {

void register_info(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("info", "build options, CPU, threads, io_uring, CUDA devices");
  cmd->add_flag("--json", *json, "print one JSON object");
  cmd->callback([json] {
    const CpuFeatures& f = cpu_features();
    nlohmann::json j = {
        {"version", STRATA_VERSION},
        {"build",
         {{"type", STRATA_BUILD_TYPE},
          {"compiler", STRATA_BUILD_COMPILER},
          {"cpu_arch", STRATA_BUILD_CPU_ARCH},
          {"cuda_toolkit", std::string(STRATA_BUILD_CUDA) == "ON"},
          {"cuda_backend", STRATA_BUILD_CUDA_BACKEND},
          {"cuda_architectures", STRATA_BUILD_CUDA_ARCHS},
          {"io_uring", std::string(STRATA_BUILD_URING) == "ON"},
          {"mpi", std::string(STRATA_BUILD_MPI) == "ON"}}},
        {"cpu",
         {{"model", f.model},
          {"isa", f.describe()},
          {"threads", hardware_threads()},
          {"tbb_threads", tbb::info::default_concurrency()},
          {"memory_bytes", physical_memory_bytes()},
          {"adamw_isa", std::string(adam_isa_name(adamw_active_isa()))}}},
        {"io", io_info()},
        {"cuda", {{"built", cuda_built()}, {"devices", cuda_device_count()}, {"describe", cuda_describe()}}},
    };
    if (*json) {
      std::printf("%s\n", j.dump(2).c_str());
      return;
    }
    std::printf("strata %s (%s, %s)\n", STRATA_VERSION, STRATA_BUILD_TYPE, STRATA_BUILD_COMPILER);
    std::printf("  build     cuda toolkit %s, cuda backend %s (archs %s), io_uring %s, mpi %s, cpu arch %s\n",
                STRATA_BUILD_CUDA, STRATA_BUILD_CUDA_BACKEND, STRATA_BUILD_CUDA_ARCHS,
                STRATA_BUILD_URING, STRATA_BUILD_MPI, STRATA_BUILD_CPU_ARCH);
    std::printf("  cpu       %s\n  isa       %s\n  threads   %d (oneTBB default %d)\n  memory    %s\n",
                f.model.c_str(), f.describe().c_str(), hardware_threads(),
                tbb::info::default_concurrency(), format_bytes(physical_memory_bytes()).c_str());
    std::printf("  adamw     %s\n", std::string(adam_isa_name(adamw_active_isa())).c_str());
    std::printf("  io        %s\n", j["io"].dump().c_str());
    const auto& io = j["io"];
    const auto& tlb = io["hugetlb_2m_pages"];
    std::printf("  staging   %s pages%s%s (hugetlb 2M pages: %llu free of %llu reserved; thp %s)\n",
                io["staging_pages"].get<std::string>().c_str(),
                io.contains("staging_pages_why") ? ": " : "",
                io.contains("staging_pages_why") ? io["staging_pages_why"].get<std::string>().c_str() : "",
                static_cast<unsigned long long>(tlb["free"].get<uint64_t>()),
                static_cast<unsigned long long>(tlb["total"].get<uint64_t>()),
                io["thp"]["enabled"].get<std::string>().c_str());
    if (io.contains("io_uring_registers_buffers"))
      std::printf("  io_uring  registers buffers: %s, files: %s\n",
                  io["io_uring_registers_buffers"].get<bool>() ? "yes" : "no",
                  io.value("io_uring_registers_files", false) ? "yes" : "no");
    std::printf("  cuda      %s\n", cuda_describe().c_str());
    std::fflush(stdout);
  });
}

}  // namespace strata::app
