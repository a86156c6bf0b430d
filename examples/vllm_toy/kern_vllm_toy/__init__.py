"""vLLM general plugin: registers the KernToyForCausalLM architecture (lazily)."""


def register():
    from vllm import ModelRegistry

    if "KernToyForCausalLM" not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(
            "KernToyForCausalLM", "kern_vllm_toy.model:KernToyForCausalLM"
        )
