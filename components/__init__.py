"""Model code that workloads share: tiny and real base models (`basemodel`), language-model parts
(`lm`), adapter audits (`adapters`), on-disk models and datasets (`pretrained`) and the cache
directory (`cache`). Nothing here imports `orchestrator`: a workload may use it freely."""
