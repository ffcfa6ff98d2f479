"""pagedkv.models: what a run is sized by: GPU and model presets, Hugging Face configs, dtypes."""
