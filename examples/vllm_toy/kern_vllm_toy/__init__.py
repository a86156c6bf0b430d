"""vLLM general plugin: registers the KernToyForCausalLM architecture (lazily), and plants a block-hash
fault in vLLM where `KERN_TOY_HASH_FAULT` asks for one (`faults.py`: negative controls)."""


def register():
    from vllm import ModelRegistry
    from vllm.logger import init_logger

    from kern_vllm_toy.faults import plant

    if "KernToyForCausalLM" not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(
            "KernToyForCausalLM", "kern_vllm_toy.model:KernToyForCausalLM"
        )
    plant(init_logger("vllm.kern_vllm_toy"))
