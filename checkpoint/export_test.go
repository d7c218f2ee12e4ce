package checkpoint

// SetCrash sets the crash hook (tests only).
func SetCrash(f func(step string)) { crash = f }
