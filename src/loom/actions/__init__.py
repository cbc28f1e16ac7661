"""Action level: scheduling tool and reward calls on pooled external resources."""
