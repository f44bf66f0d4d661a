# placeholder until the image stage lands
IMAGES_TARGETS = []
