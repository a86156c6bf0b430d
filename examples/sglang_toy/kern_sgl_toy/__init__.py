"""SGLang out-of-tree package for the kern toy: SGLANG_EXTERNAL_MODEL_PACKAGE=kern_sgl_toy
(SGLang imports each module of this package and registers its EntryClass)."""
