"""id-tracker: launch an agent program under a fresh Kairos agent identity."""
