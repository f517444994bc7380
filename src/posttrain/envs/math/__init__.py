"""Math environments: answer verification (``verify``), GSM8K (``gsm8k``) and math with a Python tool (``math_tool``)."""
