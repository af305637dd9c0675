"""Figure text of the reference page "Your model's positions", English and Chinese."""

LABELS = {
    "en": {
        "pair": "rotary pair i",
        "wavelength": "wavelength (positions)",
        "as_trained": "as trained",
        "after_scaling": "after the model's scaling",
        "training_length": "training length",
        "target_length": "target context",
        "menu": "model",
        "slider": "target context",
        "title": "{model}, target {target}:<br>{unseen} of {pairs} pairs meet unseen angles",
        "static_title": "{model}, target {target}: {unseen} of {pairs} pairs meet unseen angles",
        "explore": "Each rotary pair's wavelength in a released model, as trained and after "
                   "the model's own scaling, against its training length and a target "
                   "context; a menu picks the model, a slider the target context.",
        # the menu's entries, per family of posenc.rope_families (model names: not translated)
        "family": {
            "llama2": "Llama 2 7B",
            "llama3.1": "Llama 3.1 8B",
            "mistral7b": "Mistral 7B",
            "qwen2.5": "Qwen2.5 7B + YaRN",
            "gemma3": "Gemma 3 4B (global)",
            "deepseek-v3": "DeepSeek-V3",
            "phi3.5-mini": "Phi-3.5-mini",
            "gpt-oss": "gpt-oss-20b",
            "qwen2-vl": "Qwen2-VL 7B",
        },
    },
    "zh": {
        "pair": "旋转对序号 i",
        "wavelength": "波长（位置数）",
        "as_trained": "训练时",
        "after_scaling": "模型自带的缩放之后",
        "training_length": "训练长度",
        "target_length": "目标上下文",
        "menu": "模型",
        "slider": "目标上下文",
        "title": "{model}，目标 {target}：<br>{pairs} 对中有 {unseen} 对遇到没见过的角度",
        "static_title": "{model}，目标 {target}：{pairs} 对中有 {unseen} 对遇到没见过的角度",
        "explore": "一个已发布模型每个旋转对的波长：训练时的、经模型自带缩放之后的，"
                   "并与训练长度和目标上下文对照；菜单选模型，滑块选目标上下文。",
        "family": {
            "llama2": "Llama 2 7B",
            "llama3.1": "Llama 3.1 8B",
            "mistral7b": "Mistral 7B",
            "qwen2.5": "Qwen2.5 7B + YaRN",
            "gemma3": "Gemma 3 4B（全局层）",
            "deepseek-v3": "DeepSeek-V3",
            "phi3.5-mini": "Phi-3.5-mini",
            "gpt-oss": "gpt-oss-20b",
            "qwen2-vl": "Qwen2-VL 7B",
        },
    },
}
